"""drmas_benchmarks.validation_cost on the smoke preset's tiny model: one row per engine call, totals that add up."""

import re

import pytest

from drmas_benchmarks import validation_cost as bench


def test_report_lists_every_engine_call_of_one_validation(tmp_path):
    out = tmp_path / "vc.md"
    text = bench.main(["--preset", "smoke", "--set", f"log.run_dir={tmp_path / 'run'}", "--profile", "--out", str(out)])
    assert out.read_text() == text
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \|", text, flags=re.M)
    # smoke: 4 problems x 2 samples, then 4 greedy; each pass opens with one Solver call per episode
    requests = [int(r[1]) for r in rows]
    assert requests[0] == 8 and 4 in requests[1:]
    new_tokens = sum(int(r[3]) for r in rows)
    assert f"; {new_tokens} generated tokens" in text
    assert "| op | self CPU s | share |" in text
    assert "load average before" in text and "cores" in text


def test_prefill_asks_for_the_vllm_backend_before_validating(tmp_path):
    with pytest.raises(SystemExit, match="vllm backend"):
        bench.main(["--preset", "smoke", "--set", f"log.run_dir={tmp_path / 'run'}", "--prefill"])
