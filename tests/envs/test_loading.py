"""Envs from outside the package: `package.module:factory` references and the `drmas_envs.envs` entry points.

The entry-point tests install a real (tiny) distribution: a dist-info folder with `entry_points.txt`
on a temporary sys.path entry, found by importlib.metadata's own discovery.
"""

import json
import os
import subprocess
import sys
import textwrap

import pettingzoo
import pytest
from pettingzoo.test import api_test

import drmas_envs
from drmas_envs import EnvNotFoundError, WorkflowEnv, registry
from drmas_envs.examples.debate import Debate

DEBATE = "drmas_envs.examples.debate:debate_env"
TASKS = [{"problem": "What is 2 + 3?", "answer": "5"}, {"problem": "What is 1 + 1?", "answer": "2"}]


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Registrations made by a test (discovered entry points) end with it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_factory_reference_builds_a_pettingzoo_env():
    env = drmas_envs.make(DEBATE, format_penalty=0.5)
    assert isinstance(env, WorkflowEnv) and env.possible_agents == ["proposer", "critic"]
    assert env.format_penalty == {"proposer": 0.5, "critic": 0.5}
    api_test(drmas_envs.make(DEBATE), num_cycles=20)


def test_workflow_class_reference_takes_tasks_or_a_dataset(tmp_path):
    env = drmas_envs.make("drmas_envs.examples.debate:Debate", tasks=TASKS)
    assert env.tasks == TASKS and env.possible_agents == ["proposer", "critic"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    env = drmas_envs.make("drmas_envs.examples.debate:Debate", dataset=str(path), format_penalty=0.25)
    env.reset(options={"task_index": 1})
    env.step("\\boxed{2}")
    env.step("agreed, \\boxed{2}")
    assert env.infos["critic"]["correct"] is True and env.rewards == {"proposer": 1.0, "critic": 1.0}


@pytest.mark.parametrize(
    "reference, kwargs, error, message",
    [
        ("no_such_pkg.teams:debate", {}, EnvNotFoundError, "no module named 'no_such_pkg.teams'"),
        ("drmas_envs.examples.debate:no_such", {}, EnvNotFoundError, "has no attribute 'no_such'"),
        ("drmas_envs.examples.debate:PROMPTS", {}, EnvNotFoundError, "neither a callable returning an AEC env"),
        ("drmas_envs.examples.debate:", {}, EnvNotFoundError, "expected 'package.module:factory'"),
        ("drmas_envs.examples.debate:Debate", {}, ValueError, "give its tasks, as tasks="),
        ("builtins:dict", {}, TypeError, "returned a dict, not a PettingZoo AECEnv"),
        ("no-such-env", {}, EnvNotFoundError, "unknown env id 'no-such-env'; known ids: math-1agent"),
    ],
)
def test_bad_references_are_one_line_errors_naming_what_is_missing(reference, kwargs, error, message):
    with pytest.raises(error) as info:
        drmas_envs.make(reference, **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_missing_dependency_of_the_module_is_named(tmp_path, monkeypatch):
    (tmp_path / "team_with_missing_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvNotFoundError, match="importing team_with_missing_dep failed: .*no_such_dependency_xyz"):
        drmas_envs.make("team_with_missing_dep:env")


def install_demo_team(root):
    """A package `demo_team` and its dist-info declaring three envs in the `drmas_envs.envs` group."""
    (root / "demo_team").mkdir()
    (root / "demo_team" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from drmas_envs.examples.debate import Debate, debate_env


            class LongDebate(Debate):
                rounds = 3
                max_calls = 6


            def make_team(**kwargs):
                return debate_env(**kwargs)
            """
        )
    )
    dist = root / "demo_team-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-team\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[drmas_envs.envs]\n"
        "demo-debate = demo_team:make_team\n"
        "demo-long-debate = demo_team:LongDebate\n"
        "math-2agent = demo_team:make_team\n"  # clashes with a built-in id: the built-in wins
    )


def test_installed_entry_points_are_found_by_id(tmp_path, monkeypatch):
    install_demo_team(tmp_path)
    assert "demo-debate" not in drmas_envs.list_envs()
    monkeypatch.syspath_prepend(str(tmp_path))
    env = drmas_envs.make("demo-debate")  # a miss triggers discovery
    assert env.possible_agents == ["proposer", "critic"]
    ids = drmas_envs.list_envs(verbose=True)
    assert "demo-debate: demo_team:make_team (from demo-team)" in ids
    assert "demo-long-debate: demo_team:LongDebate (from demo-team)" in ids
    long = drmas_envs.make("demo-long-debate", tasks=TASKS)
    assert long.max_calls == 6
    assert registry.spec("math-2agent").entry_point == "drmas_envs.math.env:math_env"
    pz = pettingzoo.make("aec", "drmas/demo-debate-v0")  # mirrored into PettingZoo's registry
    pz.reset(seed=0)
    assert pz.agent_selection == "proposer"


def test_entry_points_are_registered_on_import_in_a_fresh_process(tmp_path):
    install_demo_team(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = "import drmas_envs, pettingzoo; print(drmas_envs.registry._REGISTRY['demo-debate'].entry_point)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "demo_team:make_team"


def test_a_registered_workflow_class_takes_its_tasks_from_the_registration():
    drmas_envs.register("test-debate-class", Debate, tasks=TASKS, description="a Workflow subclass")
    env = drmas_envs.make("test-debate-class")
    assert isinstance(env, WorkflowEnv) and env.tasks == TASKS
