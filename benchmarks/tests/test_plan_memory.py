"""The plan's learner memory model against a real update's peak RSS, on a 28 M-parameter random Qwen2 (fp32).

The full check (SmolLM2-135M with and without gradient checkpointing, a 0.5 B Qwen2.5) is
`drmas_benchmarks.plan_memory` (benchmarks/results/plan_memory.md); this one is small enough for the suite.
"""

import pytest

from drmas_benchmarks import plan_memory


@pytest.mark.slow
def test_planned_learner_memory_is_within_a_quarter_of_the_measured_peak():
    case = dict(model="small-qwen2", shape=plan_memory.SMALL_QWEN2, prompt=128, response=128, micro=4, ckpt=False)
    measured = plan_memory.measure(case, threads=1)
    predicted = plan_memory.predict(case)
    peak = measured["peak"] - measured["before"]
    assert measured["n_params"] == predicted["n_params"]
    assert abs(predicted["total"] / peak - 1) < 0.25, (predicted, measured)
