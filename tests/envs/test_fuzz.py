"""Fuzz every registered env: random, unicode, empty, hostile and 100 kB actions.

No exception, every episode ends within its call cap, every reward is finite. No env is skipped: a
registered env whose module is missing or broken fails here.
"""

import math
import random

import pytest

import drmas_envs
from drmas_envs import run_lockstep

EPISODES = 1000  # per env, in lock-step batches
BATCH = 200
PRINTABLE = "abcxyz0123456789 <>/{}\\()=+-*^_.,?!$#\n\t"
VALID = [
    "\\boxed{1}",
    "\\boxed{\\frac{1}{2}}",
    "<verify>approve</verify>",
    "<verify>reject</verify>",
    "<search>capital of France</search>",
    "<answer>Paris</answer>",
    "<verdict>yes</verdict>",
    "yes",
    "no",
]
HUGE = [
    "x" * 100_000,
    "\\boxed{" * 14_000,
    "<verify>" * 12_000,
    "{" * 100_000,
    "<search>" + "a " * 50_000 + "</search>",
    "<answer>" + "é" * 100_000 + "</answer>",
    "\\boxed{" + "9^{" * 30_000 + "}" * 30_000 + "}",
]


def random_unicode(rng, n):
    # any code point, lone surrogates included: model output decoded leniently can contain them
    return "".join(chr(rng.randrange(0x110000)) for _ in range(n))


def random_action(rng):
    kind = rng.random()
    if kind < 0.1:
        return ""
    if kind < 0.35:
        return "".join(rng.choice(PRINTABLE) for _ in range(rng.randrange(1, 200)))
    if kind < 0.5:
        return random_unicode(rng, rng.randrange(1, 100))
    if kind < 0.8:
        return rng.choice(VALID) + (" " + random_unicode(rng, 5) if rng.random() < 0.3 else "")
    if kind < 0.9:
        return "\\boxed{" + "".join(rng.choice(PRINTABLE) for _ in range(rng.randrange(1, 12))) + "}"
    return rng.choice(HUGE)


def env_kwargs(env_id):
    return {"grade_timeout_s": 1.0} if env_id.startswith("math") else {}


@pytest.mark.parametrize("env_id", drmas_envs.list_envs())
def test_fuzz(env_id):
    rng = random.Random(f"fuzz-{env_id}")
    ended = 0
    for start in range(0, EPISODES, BATCH):
        envs = [drmas_envs.make(env_id, **env_kwargs(env_id)) for _ in range(BATCH)]
        for i, env in enumerate(envs):
            env.reset(seed=start + i)
        results = run_lockstep(envs, lambda agent, idx, obs: [random_action(rng) for _ in idx])
        for env, res in zip(envs, results):
            assert env.agents == []  # the episode ended and every agent was removed
            assert set(res.rewards) == set(env.possible_agents)
            assert all(math.isfinite(r) for r in res.rewards.values())
            assert len(res.info["calls"]) <= env.unwrapped.max_calls
            ended += 1
    assert ended == EPISODES
