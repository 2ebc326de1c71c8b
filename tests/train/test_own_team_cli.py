"""Train your own team from the CLI: the debate example of docs/workflows.md as `--env module:factory`."""

import json

import yaml

from drmas_train.cli import main

DEBATE = "drmas_envs.examples.debate:debate_env"


def test_train_the_debate_example_from_the_cli(tmp_path):
    run = tmp_path / "run"
    argv = ["--preset", "smoke", "--env", DEBATE, "--steps", "1", "--run-dir", str(run)]
    assert main(argv + ["--backend", "transformers", "--set", "threads=1"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["step"] == 1]
    assert len(step) == 1 and step[0]["episodes"] == 8  # smoke: 2 prompts x 4 episodes
    for agent in ("proposer", "critic"):
        assert step[0][f"calls/{agent}"] >= 1 and f"reward/{agent}" in step[0] and f"valid/{agent}" in step[0]
        assert f"adv/{agent}/sq_mean" in step[0]
    assert step[0]["grad_norm/shared"] > 0
    assert yaml.safe_load((run / "config.yaml").read_text())["env"]["id"] == DEBATE
    traj = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert traj[0]["calls"][0]["agent"] == "proposer" and "Problem" in traj[0]["calls"][0]["user"]


def test_a_bad_reference_is_one_clear_line_and_a_nonzero_exit(tmp_path, capsys):
    argv = ["--preset", "smoke", "--env", "no_such_pkg.teams:debate", "--run-dir", str(tmp_path / "run")]
    assert main(argv + ["--backend", "transformers"]) != 0
    err = capsys.readouterr().err
    assert "no module named 'no_such_pkg.teams'" in " ".join(err.split()) and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
