"""Fuzz: thousands of episodes of garbage actions on every search env; none raises, every one ends."""

import math
import random

import pytest

import drmas_envs

FRAGMENTS = [
    "<search>", "</search>", "<answer>", "</answer>", "<verify>", "</verify>", "<done>", "<done/>", "yes", "no",
    "<search>{}</search>", "<answer>{}</answer>", "<verify>yes</verify>", "<verify>no</verify>", "<information>",
    "Ünïcödé ✓ 北京 🙂", "\x00", "\n", "{question}", "{}", "\\boxed{1}", "<<>>", "</", "Doc 1(Title: x)",
]  # fmt: skip


def garbage(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.05:
        return ""
    if kind < 0.1:
        return rng.choice(FRAGMENTS) * rng.randint(1, 20000)  # up to ~100-400 kB
    if kind < 0.2:
        return "".join(chr(rng.randint(0, 0x2FFFF)) for _ in range(rng.randint(1, 200)))
    parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8))]
    return "".join(p.replace("{}", rng.choice(["Warsaw", "", "  ", "Ulm Works", "é" * 3000])) for p in parts)


REFERENCE = {  # the paper presets' episode rules
    "malformed_verdict": "yes",
    "verify_last_step": True,
    "require_think": True,
    "verdict_parsing": "reference",
    "malformed_answer": "continue",
    "search_sees_verifier": True,
    "prompt_layout": "reference",
}


@pytest.mark.parametrize("rules", [{}, REFERENCE], ids=["default", "reference"])
@pytest.mark.parametrize("env_id", ["search-1agent", "search-2agent", "search-3agent"])
def test_garbage_episodes_end_cleanly(env_id, rules):
    rng = random.Random(env_id)
    env = drmas_envs.make(env_id, max_steps=4, **rules)
    limit = 2 * 4 + 1
    seen = {"searched": 0, "answered": 0, "malformed": 0}
    for episode in range(1000):
        env.reset(seed=episode if episode % 100 == 0 else None)
        for _ in range(limit):
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                break
            obs = env.observe(agent)
            assert isinstance(obs["user"], str) and obs["turn"] <= limit
            env.step(garbage(rng))
        else:
            pytest.fail(f"{env_id}: episode {episode} did not end within {limit} calls")
        assert all(env.terminations.values()) and not any(env.truncations.values())
        rewards = list(env.rewards.values())
        assert all(math.isfinite(r) and -1.0 <= r <= 1.0 for r in rewards)
        info = env.infos[agent]
        assert info["em"] in (0.0, 1.0) and 0.0 <= info["f1"] <= 1.0
        seen["searched"] += info["n_searches"] > 0
        seen["answered"] += info["answer"] is not None
        seen["malformed"] += sum(info["malformed_per_agent"].values()) > 0
    assert min(seen.values()) >= 20, seen  # the garbage reached every route, not only the malformed one
