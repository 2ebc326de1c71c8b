"""`drmas_benchmarks.plot_run` draws the panels of the run's own agents and validation keys, not math's."""

import pytest

pytest.importorskip("matplotlib", reason="plot_run needs the bench extra (matplotlib)")
from drmas_benchmarks import plot_run  # noqa: E402

SEARCH_ROWS = [
    {"step": 0, "val/avg@4": 0.0, "val/world-single-hop/avg@4": 0.0, "val/valid/search": 0.9, "val/valid/answer": 0.8},
    {"step": 1, "reward/team": 0.1, "reward/mean": 0.1, "reward/search": 0.1, "reward/answer": 0.1,
     "valid/search": 0.8, "valid/answer": 0.7, "grad_norm/shared": 1.0, "accuracy": 0.1},
]  # fmt: skip


def test_agent_panels_name_the_runs_agents():
    panels = dict(plot_run.agent_panels(SEARCH_ROWS))
    assert list(panels.values()) == [
        ["reward/answer", "reward/search"],
        ["valid/answer", "valid/search"],
        ["grad_norm/shared"],
    ]


def test_validation_detail_has_per_source_accuracy_and_validity():
    assert plot_run.validation_detail(SEARCH_ROWS) == [
        "val/valid/answer",
        "val/valid/search",
        "val/world-single-hop/avg@4",
    ]


def test_the_figure_is_drawn_for_a_search_run(tmp_path):
    import json
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SEARCH_ROWS))
    out = tmp_path / "curves.png"
    argv = sys.argv
    sys.argv = ["plot_run.py", str(run), "--out", str(out)]
    try:
        plot_run.main()
    finally:
        sys.argv = argv
    assert out.stat().st_size > 0
