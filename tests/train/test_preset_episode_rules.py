"""The paper presets (those naming a `reference`) run the reference's episode rules; the cpu and smoke
presets keep the project's.

Each paper preset's env options are applied to a real env (on the built-in data: the data options are
dropped, since the paper's sets live on the hub) and one scripted step shows the rules in force.
"""

import pytest

import drmas_envs
from drmas_train.config import build_config, list_presets, load_preset

PAPER = [p for p in list_presets() if "reference" in load_preset(p)]
DATA_OPTIONS = ("dataset", "split", "data_dir", "corpus", "retriever", "index_dir", "encoder")


def _env(preset):
    cfg = build_config(preset)
    kwargs = {k: v for k, v in cfg.env.kwargs.items() if k not in DATA_OPTIONS}
    env = drmas_envs.make(cfg.env.id, **kwargs)
    env.reset(seed=0)
    return cfg, env


@pytest.mark.parametrize("preset", PAPER)
def test_paper_presets_use_the_reference_rules(preset):
    cfg, env = _env(preset)
    first = env.agent_selection
    assert env.observe(first)["system"] == "You are a helpful assistant."  # the reference layout
    if cfg.env.id.startswith("math"):
        assert cfg.rollout.max_prompt_tokens == 8192 and cfg.rollout.truncation == "middle"
        env.step("step " * 3000 + "\\boxed{6}")
        assert "step " * 3000 in env.observe("verifier")["user"]  # whole, not clipped
        env.step("<verify>approve</verify> <verify>reject</verify>")  # the approving tag wins: the episode ends
        assert all(env.terminations.values())
        assert env.infos["solver"]["malformed_per_agent"]["verifier"] == 0
    else:
        assert cfg.rollout.max_prompt_tokens == 4096 and cfg.rollout.truncation == "left"
        env.step("Not enough yet. <verify>no</verify>")
        assert "Not enough yet. <verify>no</verify>" in env.observe("search")["user"]
        env.step("<think>t</think><search>capital</search>")
        env.step("<verify>yes</verify>")
        env.step("<think>t</think> no tag")  # the Verifier runs again
        assert env.agent_selection == "verifier" and not any(env.terminations.values())


@pytest.mark.parametrize("preset", ["cpu", "smoke"])
def test_cpu_and_smoke_keep_the_project_rules(preset):
    cfg, env = _env(preset)
    assert cfg.rollout.truncation == "middle"
    assert not {"prompt_layout", "verdict_parsing", "max_context_chars", "prompts_file"} & set(cfg.env.kwargs)
    assert "Example" in env.observe("solver")["system"]
