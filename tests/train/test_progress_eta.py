"""The progress line's ETA: the steps left at this process's mean step time so far."""

from drmas_train.cli import main
from drmas_train.cli.main import eta


def test_eta_is_the_mean_step_time_times_the_steps_left():
    assert eta(30.0, 3, 7) == "ETA 0:01:10"
    assert eta(7200.0, 2, 3) == "ETA 3:00:00"
    assert eta(5.0, 0, 10) == "ETA -"  # nothing timed yet
    assert eta(12.0, 4, 0) == "ETA 0:00:00"


def test_a_run_prints_its_eta_on_the_progress_line(tmp_path, capsys, monkeypatch):
    import importlib

    from rich.console import Console

    cli_main = importlib.import_module("drmas_train.cli.main")

    # a terminal (the live progress line is drawn on terminals only), wide enough for the whole line
    monkeypatch.setattr(cli_main, "console", Console(stderr=True, force_terminal=True, width=400))
    run = ["--preset", "smoke", "--run-dir", str(tmp_path / "run"), "--set", "steps=2", "--set", "eval.every=0"]
    assert main([*run, "--set", "eval.before_train=false"]) == 0
    err = capsys.readouterr().err  # the console writes to stderr
    assert "ETA 0:00:00" in err  # the last step's line: nothing left
