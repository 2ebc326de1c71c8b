"""The TRL row of `drmas_benchmarks.step_efficiency`: TRL's `GRPOTrainer`, in its own virtual environment.

    .venv-trl/bin/python benchmarks/drmas_benchmarks/step_efficiency_trl.py --spec spec.json --result out.json \
        [--gradient-checkpointing]

(`bash scripts/setup_trl_venv.sh` builds `.venv-trl`.) Imports only torch, transformers, datasets and
trl, never drmas: the driver passes the resolved model folder, the prompts (chat messages, the same
tasks in the same order as drmas-train's steps) and their reference answers in the spec.

Knobs pinned to drmas-train's: `use_vllm=False`, `beta=0` (no reference model), `num_iterations=1`,
fp32, `num_generations` = group size, `max_completion_length`, temperature, top-p 1, top-k off,
AdamW lr / weight decay 0.01 / clip 1.0, micro-batch = `per_device_train_batch_size`, one optimizer
step per step (`gradient_accumulation_steps` = episodes / micro-batch, so TRL generates the whole
step's completions in one batch), token-mean loss (`dapo`, TRL's default), no dataset shuffle.
The reward is 1 when the last \\boxed{} equals the reference exactly, else 0 (a cheap string check:
drmas-train's math-verify grading is timed on its own row).

Step wall time: the interval between consecutive `on_step_end` callbacks (the first step: from
`on_train_begin`), so logging and data loading between steps are counted. Inside it, `generate` is
TRL's `_generate` (prompt tokenisation + `model.generate`) and `update` the micro-steps' forward and
backward (`training_step` less `_prepare_inputs`) plus gradient clipping and the optimizer step.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the completion's last \\boxed{} holds exactly the reference answer, else 0.0."""
    out = []
    for completion, ref in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        found = BOXED.findall(text)
        out.append(float(bool(found) and found[-1].strip() == str(ref).strip()))
    return out


def run(spec: dict[str, Any], gradient_checkpointing: bool) -> dict[str, Any]:
    """Train `warmup + steps` steps with TRL's GRPOTrainer; return each step's timings."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["threads"])
    clock: dict[str, float] = {"generate": 0.0, "train_step": 0.0, "prepare": 0.0, "optimizer": 0.0, "last": 0.0}

    class TimedGRPO(GRPOTrainer):
        """GRPOTrainer whose generation, micro-steps and input preparation add up their seconds."""

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._generate(*args, **kwargs)
            finally:
                clock["generate"] += time.perf_counter() - t0

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._prepare_inputs(*args, **kwargs)
            finally:
                clock["prepare"] += time.perf_counter() - t0

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super().training_step(*args, **kwargs)
            finally:
                clock["last"] = time.perf_counter()
                clock["train_step"] += clock["last"] - t0

    steps: list[dict[str, float]] = []

    class StepClock(TrainerCallback):
        """Per-step wall time and the counters' increments, from one `on_step_end` to the next."""

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.t, self.seen = time.perf_counter(), dict(clock)

        def on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            clock["optimizer"] += time.perf_counter() - clock["last"]  # grad clip + AdamW step

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            d = {k: clock[k] - self.seen[k] for k in clock if k != "last"}
            update = d["train_step"] - d["prepare"] + d["optimizer"]
            steps.append({"wall": now - self.t, "time/generate": d["generate"], "time/update": update})
            self.t, self.seen = now, dict(clock)

    pairs = zip(spec["step_prompts"], spec["step_answers"])
    rows = [{"prompt": m, "answer": a} for prompts, answers in pairs for m, a in zip(prompts, answers)]
    n_steps = spec["warmup"] + spec["steps"]
    episodes = spec["prompts"] * spec["group"]
    micro = min(spec["micro"], episodes)
    if episodes % micro:
        raise ValueError(f"prompts x group ({episodes}) must be a multiple of the micro-batch ({micro})")
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="trl-step-eff-") as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=False,
            fp16=False,
            use_vllm=False,
            beta=0.0,
            num_iterations=1,
            num_generations=spec["group"],
            max_completion_length=spec["max_new_tokens"],
            temperature=spec["temperature"],
            top_p=1.0,
            top_k=0,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=episodes // micro,
            gradient_checkpointing=gradient_checkpointing,
            learning_rate=spec["lr"],
            lr_scheduler_type="constant",
            weight_decay=0.01,
            max_grad_norm=1.0,
            max_steps=n_steps,
            shuffle_dataset=False,
            disable_dropout=True,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            dataloader_num_workers=0,
            seed=spec["seed"],
        )
        trainer = TimedGRPO(
            model=model,
            reward_funcs=boxed_reward,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[StepClock()],
        )
        trainer.train()
    if len(steps) != n_steps:
        raise RuntimeError(f"TRL ran {len(steps)} steps, expected {n_steps}")
    import trl

    return {"warmup": steps[: spec["warmup"]], "steps": steps[spec["warmup"] :], "trl": trl.__version__}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, required=True, help="the driver's settings (JSON)")
    p.add_argument("--result", type=Path, required=True, help="where this row's figures go (JSON)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    args = p.parse_args(argv)
    out = run(json.loads(args.spec.read_text()), args.gradient_checkpointing)
    out["self_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    args.result.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
