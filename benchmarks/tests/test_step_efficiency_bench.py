"""drmas_benchmarks.step_efficiency: the driver end to end on the tiny model, the report's tables and ratios."""

import json
from pathlib import Path

import pytest

from drmas_benchmarks import step_efficiency as bench
from drmas_benchmarks import step_efficiency_report as report

TRL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-trl" / "bin" / "python"


def tiny_args(tmp_path, rows, *extra):
    return [
        *("--rows", rows, "--model", "tiny", "--prompts", "2", "--max-new-tokens", "6", "--threads", "1"),
        *("--steps", "1", "--warmup", "1", "--out", str(tmp_path / "se.md"), "--work-dir", str(tmp_path / "work")),
        *extra,
    ]


@pytest.mark.slow
def test_drmas_and_floor_rows_end_to_end_on_the_tiny_model(tmp_path):
    no_trl = str(tmp_path / "absent" / "python")
    argv = tiny_args(tmp_path, "drmas-transformers,floor,trl", "--group", "2", "--trl-python", no_trl)
    assert bench.main(argv) == 0
    rows = json.loads((tmp_path / "se.json").read_text())["rows"]
    assert "no TRL venv" in rows["trl"]["skipped"]  # optional: a row of its own, with the reason
    drmas, floor = rows["drmas-transformers"], rows["floor"]
    assert len(drmas["warmup"]) == 1 and len(drmas["steps"]) == 1 and len(floor["steps"]) == 1
    step = drmas["steps"][0]
    # The trainer's clocks nest inside the driver's: generate in rollout, rollout in the step, the step in wall.
    assert 0 < step["time/generate"] < step["time/rollout"] < step["time/step"] <= step["wall"]
    assert step["time/sync"] <= step["time/update"] < step["time/step"]
    for key in ("time/prompts", "time/advantages", "time/metrics"):  # the parts of "other" the trainer times
        assert step[key] > 0, key
    assert floor["steps"][0]["time/generate"] > 0 and floor["steps"][0]["time/update"] > 0
    assert drmas["peak_rss_mb"] > 100 and floor["peak_rss_mb"] > 100  # polled: torch alone is more
    text = (tmp_path / "se.md").read_text()
    assert bench.cpu_model() in text and "Load average" in text
    assert "| drmas-transformers | " in text and "| floor | " in text
    assert "- step vs the plain floor (drmas-transformers / floor): " in text and "x, target <= 0.75" in text


@pytest.mark.slow
def test_trl_row_on_the_tiny_model(tmp_path):
    if not TRL_PYTHON.exists():
        pytest.skip("optional comparison: no TRL venv (bash scripts/setup_trl_venv.sh builds .venv-trl)")
    assert bench.main(tiny_args(tmp_path, "trl", "--group", "4")) == 0
    trl = json.loads((tmp_path / "se.json").read_text())["rows"]["trl"]
    assert len(trl["steps"]) == 1 and trl["trl"]
    step = trl["steps"][0]
    assert (
        0 < step["time/generate"]
        and 0 < step["time/update"]
        and step["time/generate"] + step["time/update"] <= step["wall"]
    )


def test_report_medians_breakdown_and_ratio_verdicts():

    def drmas_step(wall):
        return {
            "wall": wall,
            "time/step": wall - 0.5,
            "time/rollout": 6.0,
            "time/generate": 4.0,
            "time/update": 3.0,
            "time/prompts": 0.25,
            "time/grading": 0.5,
            "time/advantages": 0.125,
            "time/metrics": 0.125,
            "time/sync": 1.0,
        }

    results = {
        "drmas-transformers": {"steps": [drmas_step(w) for w in (10.0, 30.0, 20.0)], "peak_rss_mb": 2048.0},
        "floor": {"steps": [{"wall": 25.0, "time/generate": 10.0, "time/update": 15.0}], "peak_rss_mb": 1024.0},
        "trl": {"skipped": "skipped: no TRL venv"},
    }
    for r in results.values():
        r.update(load_start="0.1", load_end="0.2")
    s = report.summarise(results["drmas-transformers"])
    assert s["wall"] == 20.0 and s["n"] == 3 and s["other"] == 13.0
    # env = rollout - generate - prompts - grading; logging = wall - the trainer's time/step
    assert s["env"] == 1.25 and s["logging"] == 0.5
    assert s["unaccounted"] == 13.0 - (0.25 + 1.25 + 0.5 + 0.125 + 0.125 + 0.5)
    verdicts = {
        what: (value, target)
        for what, _, value, target in report.ratios(
            {k: report.summarise(v) for k, v in results.items() if "steps" in v}
        )
    }
    assert verdicts["step vs the plain floor"] == (0.8, 0.75)
    assert verdicts["step vs TRL"] == (None, 0.75)
    meta = dict(command="c", date="d", commit="x", cpu="cpu", cores=2, threads=2, load_start="1", load_end="2")
    text = report.render({**meta, "warmup": 1, "setting": "s"}, results)
    assert "(drmas-transformers / floor): 0.80x, target <= 0.75 (misses)" in text
    assert "- trl: skipped: no TRL venv" in text
    assert "| drmas-transformers | 20.00 | 4.00 | 3.00 | 13.00 | 65.00 | 2.00 | 3 | 0.1-0.2 |" in text
