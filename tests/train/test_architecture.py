"""The architecture: the config at the bottom (no torch), no import circles, typed components, each choice
declared once, and a top level that shows the stages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from drmas_train.algorithm.advantages import ESTIMATORS, compute_advantages
from drmas_train.cli import main
from drmas_train.cli.args import train_parser
from drmas_train.config import Estimator, build_config, choices, list_presets
from drmas_train.config.help import PLAIN_FLAGS, iter_fields, render

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from golden_record import apply, differences, expected, load  # noqa: E402
from import_graph import PACKAGES, cycles, graph  # noqa: E402


def test_importing_the_config_loads_no_torch_and_nothing_else_of_the_package():
    code = (
        "import sys, drmas_train.config; "
        "print('torch' in sys.modules); "
        "print(sorted(m for m in sys.modules if m.startswith('drmas_train') and 'config' not in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines() == ["False", "['drmas_train']"]


def test_the_config_package_imports_only_itself():
    edges = graph()
    outside = {
        (m, t)
        for m, targets in edges.items()
        if m.startswith("drmas_train.config")
        for t in targets
        if not t.startswith("drmas_train.config")
    }
    assert outside == set()


def test_no_module_imports_another_in_a_circle():
    assert cycles(graph()) == []


STAGES = {"config", "algorithm", "engines", "learner", "rollout", "placement", "plan", "run", "cli", "testing"}


def test_the_top_level_holds_only_folders_one_per_stage():
    top = PACKAGES["drmas_train"]
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py", "__main__.py"]
    folders = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == STAGES | {"presets"}
    assert not [p for p in top.rglob("*_utils.py")]


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "drmas_train" and len(parts) > 2 else None


# Each stage may import the stages listed after it in its row, and nothing else of drmas_train: data flows
# environment -> rollout -> advantages -> learner -> weights back to the engines, the run loop drives them all.
LAYERS = {
    "config": set(),
    "algorithm": {"config"},
    "testing": {"config"},
    "engines": {"config", "testing"},
    "learner": {"config", "algorithm", "engines"},
    "rollout": {"config", "algorithm", "engines"},
    "placement": {"config", "algorithm", "engines", "learner", "rollout"},
    "plan": {"config", "engines"},
    "run": {"config", "algorithm", "engines", "learner", "rollout", "placement"},
    "cli": {"config", "algorithm", "engines", "learner", "rollout", "placement", "plan", "run"},
}


def test_every_stage_imports_only_the_stages_below_it():
    crossing = set()
    for module, targets in graph().items():
        here = _stage(module)
        for target in targets:
            there = _stage(target)
            if here and there and there != here and there not in LAYERS[here]:
                crossing.add(f"{module} -> {target}")
    assert crossing == set()


def test_the_circle_finder_finds_circles():
    # What makes the test above fail: a planted circle, and one through a third module.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _config_params(tree: ast.AST):
    """(function, parameter, annotation source or None) of every parameter that takes a config."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                name = arg.arg
                if name in ("cfg", "config") or name.endswith(("_cfg", "_config")):
                    yield node.name, name, ast.unparse(arg.annotation) if arg.annotation else None


def test_no_function_takes_an_untyped_config():
    loose = []
    for folder in PACKAGES.values():
        for path in sorted(folder.rglob("*.py")):
            for func, name, annotation in _config_params(ast.parse(path.read_text())):
                if annotation is None or annotation in ("Any", "object") or annotation.startswith("dict"):
                    if name.endswith("peft_config"):  # a PEFT adapter's own settings, not ours
                        continue
                    loose.append(f"{path.name}:{func}({name}: {annotation})")
    assert loose == []


def test_the_finder_of_untyped_configs_sees_them():
    src = "def f(cfg, x): pass\ndef g(models_cfg: Any): pass\ndef h(cfg: TrainConfig): pass\n"
    assert list(_config_params(ast.parse(src))) == [
        ("f", "cfg", None),
        ("g", "models_cfg", "Any"),
        ("h", "cfg", "TrainConfig"),
    ]


CHOICE_FIELDS = {f.key: f.choices for f in iter_fields() if f.choices and "<" not in f.key}


def test_every_closed_choice_is_declared_as_a_literal():
    assert {"algo.estimator", "models.assignment", "models.backend", "learner.forward", "placement.mode"} <= set(
        CHOICE_FIELDS
    )


@pytest.mark.parametrize("key", sorted(CHOICE_FIELDS))
def test_a_choice_is_checked_listed_and_offered_from_its_type(key):
    allowed = CHOICE_FIELDS[key]
    for value in allowed:
        build_config("smoke", {key: value})
    with pytest.raises(ValueError, match=rf"{key.split('.')[-1]} must be one of"):
        build_config("smoke", {key: "no-such-choice"})
    assert f"Choices: {', '.join(allowed)}." in " ".join(render(key).split())
    if key in PLAIN_FLAGS:
        flag = next(a for a in train_parser()._actions if PLAIN_FLAGS[key] in a.option_strings)
        assert tuple(flag.choices) == allowed


def test_a_section_built_directly_checks_its_choices_too():
    from drmas_train.config import AlgoConfig, PoolSize

    with pytest.raises(ValueError, match="algo.estimator must be one of"):
        AlgoConfig(estimator="ppo")
    with pytest.raises(ValueError, match="placement pool.strategy must be one of"):
        PoolSize(strategy="zero3")


def test_the_estimator_table_is_the_config_type():
    assert tuple(ESTIMATORS) == choices(Estimator)
    rewards, groups = [1.0, 0.0, 0.5, 0.0], [0, 0, 0, 0]
    agents, episodes = ["s", "s", "v", "v"], [0, 1, 0, 1]
    for name, spec in ESTIMATORS.items():
        assert spec.help
        got = compute_advantages(rewards, group_ids=groups, agent_ids=agents, episode_ids=episodes, estimator=name)
        assert len(got) == 4
    # drmas by hand: solver (1, 0) -> +-0.7071 (unbiased std 0.7071); verifier (0.5, 0) -> +-0.7071
    drmas = compute_advantages(rewards, group_ids=groups, agent_ids=agents, episode_ids=episodes)
    assert drmas == pytest.approx([0.70710, -0.70710, 0.70710, -0.70710], abs=1e-4)


@pytest.mark.parametrize("preset", list_presets())
def test_print_config_of_every_preset_is_as_recorded(preset, capsys):
    assert main(["--preset", preset, "--print-config"]) == 0
    assert preset in load()["presets"], f"no recorded output for preset {preset!r}: python tests/train/golden_record.py"
    assert capsys.readouterr().out == expected(preset), (
        f"`drmas-train --preset {preset} --print-config` changed; if the change is meant, record it with "
        "`python tests/train/golden_record.py` and read the record's diff"
    )


def test_the_record_keeps_key_order_and_names_only_real_fields():
    default = {"a": 1, "kw": {"x": 1}, "s": {"b": 2, "c": [1]}}
    changed = {"a": 1, "kw": {"y": 2, "x": 1}, "s": {"b": 3, "c": [1]}}
    diff = differences(default, changed)
    assert diff == {"kw": {"y": 2, "x": 1}, "s.b": 3}
    assert list(apply(default, diff)["kw"]) == ["y", "x"] and apply(default, diff) == changed
    assert default["s"]["b"] == 2  # untouched
    assert differences({"v": 1}, {"v": 1.0}) == {"v": 1.0}  # 1 and 1.0 print differently
    with pytest.raises(KeyError, match="no field"):
        apply(default, {"s.typo": 1})


def _stage_graph() -> dict[str, set[str]]:
    """Stage -> the other stages (besides config) its modules import, from the code."""
    out: dict[str, set[str]] = {stage: set() for stage in STAGES}
    for module, targets in graph().items():
        here = _stage(module)
        for target in targets:
            there = _stage(target)
            if here and there and there not in (here, "config"):
                out[here].add(there)
    return out


def test_the_architecture_doc_draws_the_stage_graph_of_the_code():
    doc = (PACKAGES["drmas_train"].parents[1] / "docs" / "architecture.md").read_text()
    drawn: dict[str, set[str]] = {stage: set() for stage in STAGES}
    for line in doc.splitlines():
        stage, _, targets = line.partition("->")
        if line.startswith("    ") and stage.strip() in STAGES:
            drawn[stage.strip()] = {t.strip() for t in targets.split("(")[0].split(",")}
    assert drawn == _stage_graph()
