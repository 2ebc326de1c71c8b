"""One row of benchmarks/drmas_benchmarks/step_efficiency.py, in a process of its own (the driver polls its memory).

    .venv/bin/python -m drmas_benchmarks.step_efficiency_rows --row drmas --spec spec.json --result out.json

Rows (the spec, a JSON file the driver writes, holds the shared settings):
- `drmas`: drmas-train's `Trainer.train_step`, timed from here (outside the trainer), with the
  trainer's own `time/*` keys and the grading time (the math envs' grader, wrapped in a clock);
- `validate`: one warm-up step, then `Trainer.validate` on the held-out problems;
- `checkpoint`: one warm-up step (so AdamW has its state), then `Trainer.save`;
- `floor`: the plain floor: HF `generate` of the same prompts (group_size samples each), then one
  full forward/backward over those sequences (plain padded rows, logits at every position, as a
  plain forward gives them) in micro-batches and one AdamW step. Its advantages are seeded random
  numbers: the floor measures compute, which does not depend on their values.
Each timed figure is one step's wall time; the first `warmup` steps are returned apart.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


class GradeClock:
    """Wraps the math envs' shared grader: counts the seconds spent grading (benchmark instrumentation)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def install(self) -> None:
        """Make every math env built after this call grade through this clock."""
        import drmas_envs.math.env as math_env

        make = math_env.default_grader

        def timed_grader(*args: Any, **kwargs: Any) -> Any:
            grader = make(*args, **kwargs)  # one shared `Grader`: its `check` is timed once
            if getattr(grader.check, "timed_by", None) is self:
                return grader
            check = grader.check

            def timed(answer: str | None, reference: str) -> Any:
                t0 = time.perf_counter()
                try:
                    return check(answer, reference)
                finally:
                    self.seconds += time.perf_counter() - t0

            timed.timed_by = self  # type: ignore[attr-defined]
            grader.check = timed
            return grader

        math_env.default_grader = timed_grader


def train_config(spec: dict[str, Any], run_dir: str, *, validation: bool = False) -> Any:
    """The benchmark's `TrainConfig`: the `cpu` preset with the spec's env, model, batch and lengths."""
    from drmas_train.config import TrainConfig, from_dict, load_preset, set_dotted

    data = load_preset("cpu")
    data.pop("agents", None)  # per-agent overrides of math-2agent's Verifier
    data["env"] = {"id": spec["env"]}  # the preset's env options are math-2agent's
    over: dict[str, Any] = {
        "models.name": spec["model"],
        "models.backend": spec["backend"],
        "models.dtype": "float32",
        "rollout.prompts_per_step": spec["prompts"],
        "rollout.group_size": spec["group"],
        "rollout.max_new_tokens": spec["max_new_tokens"],
        "rollout.temperature": spec["temperature"],
        "threads": spec["threads"],
        "seed": spec["seed"],
        "steps": 1_000_000,  # never reached: no end-of-run validation or checkpoint inside a timed step
        "log.run_dir": run_dir,
        "log.tensorboard": False,
        "log.checkpoint_every": 0,
        "eval.before_train": False,
        "eval.every": 1_000_000 if validation else 0,  # enabled (envs built) but never due
    }
    if spec.get("eval_problems"):
        over["eval.n_problems"] = spec["eval_problems"]
    if spec.get("eval_k"):
        over["eval.k"] = spec["eval_k"]
    for key, value in over.items():
        set_dotted(data, key, value)
    return from_dict(TrainConfig, data)


def _timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_drmas(spec: dict[str, Any], row: str) -> dict[str, Any]:
    """Time `train_step` (row drmas), `validate` or `save` (rows validate, checkpoint) from outside."""
    from drmas_train.run.trainer import Trainer

    clock = GradeClock()
    clock.install()
    run_dir = tempfile.mkdtemp(prefix="drmas-step-eff-")
    try:
        trainer = Trainer(train_config(spec, run_dir, validation=row == "validate"))
        try:
            if row == "drmas":
                steps = []
                for _ in range(spec["warmup"] + spec["steps"]):
                    g0, t0 = clock.seconds, time.perf_counter()
                    metrics = trainer.train_step()
                    wall = time.perf_counter() - t0
                    times = {k: float(v) for k, v in metrics.items() if k.startswith("time/")}
                    steps.append({"wall": wall, "time/grading": clock.seconds - g0, **times})
                return {"warmup": steps[: spec["warmup"]], "steps": steps[spec["warmup"] :]}
            for _ in range(max(spec["warmup"], 1)):  # the engine warm, and AdamW state to checkpoint
                trainer.train_step()
            if row == "validate":
                walls = _timed(trainer.validate, spec["eval_repeats"])
                cfg = trainer.cfg.eval
                return {"steps": [{"wall": w} for w in walls], "n_problems": cfg.n_problems, "k": cfg.k}
            walls = _timed(trainer.save, spec["ckpt_repeats"])
            folder = next((Path(run_dir) / "checkpoints").glob("step-*"))
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            return {"steps": [{"wall": w} for w in walls], "checkpoint_bytes": size}
        finally:
            trainer.close()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """HF `generate` + one forward/backward/AdamW over the generated sequences, per step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas_train.engines.resolve import resolve_model

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    path = resolve_model(spec["model"])
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # dropout off, as drmas-train's learner runs
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.01)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    steps = []
    for messages in spec["step_prompts"]:
        ids = [tok.apply_chat_template(m, add_generation_prompt=True, return_dict=False) for m in messages]
        t0 = time.perf_counter()
        seqs, prompt_mask = _generate(model, [list(i) for i in ids], spec, pad)
        t1 = time.perf_counter()
        _update(model, opt, seqs, prompt_mask, spec["micro"], tok.eos_token_id)
        t2 = time.perf_counter()
        steps.append({"wall": t2 - t0, "time/generate": t1 - t0, "time/update": t2 - t1})
    return {"warmup": steps[: spec["warmup"]], "steps": steps[spec["warmup"] :]}


def _generate(model: Any, ids: list[list[int]], spec: dict[str, Any], pad: int) -> tuple[Any, Any]:
    """`group` samples of each prompt (rows repeated in place) and the prompts' padding mask per row."""
    import torch

    width = max(map(len, ids))
    rows = torch.tensor([[pad] * (width - len(i)) + i for i in ids])  # left-padded, as generate wants
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    out = model.generate(
        input_ids=rows,
        attention_mask=mask,
        do_sample=True,
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        max_new_tokens=spec["max_new_tokens"],
        num_return_sequences=spec["group"],
        pad_token_id=pad,
    )
    return out, mask.repeat_interleave(spec["group"], dim=0)


def _update(model: Any, opt: Any, seqs: Any, prompt_mask: Any, micro: int, eos: int) -> None:
    """Token-mean policy-gradient loss over the responses, micro-batch by micro-batch, then one AdamW step."""
    import torch

    width = prompt_mask.shape[1]
    response = seqs[:, width:]
    # A response ends at its first EOS (kept, as the sampler emitted it); generate pads after it.
    is_eos = (response == eos).long()
    keep = (is_eos.cumsum(-1) - is_eos) == 0
    attn = torch.cat([prompt_mask, keep.long()], dim=1)
    adv = torch.randn(len(seqs), generator=torch.Generator().manual_seed(0))
    n_tokens = keep.sum().clamp_min(1)
    for lo in range(0, len(seqs), micro):
        sl = slice(lo, lo + micro)
        pos = (attn[sl].cumsum(-1) - 1).clamp_min(0)
        logits = model(input_ids=seqs[sl], attention_mask=attn[sl], position_ids=pos).logits
        logp = torch.log_softmax(logits[:, width - 1 : -1].float(), -1)
        tok_logp = logp.gather(-1, response[sl].unsqueeze(-1)).squeeze(-1)
        loss = -(adv[sl, None] * tok_logp * keep[sl]).sum() / n_tokens  # token-mean over the batch
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", required=True, choices=("drmas", "validate", "checkpoint", "floor"))
    p.add_argument("--spec", type=Path, required=True, help="the driver's settings (JSON)")
    p.add_argument("--result", type=Path, required=True, help="where this row's figures go (JSON)")
    args = p.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    out = run_floor(spec) if args.row == "floor" else run_drmas(spec, args.row)
    out["self_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    args.result.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
