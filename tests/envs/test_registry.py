"""Every registered env passes PettingZoo's api_test and is reachable through PettingZoo's registry.

No env is skipped: a registered env whose module is missing or broken fails here.
"""

import pettingzoo
import pytest
from pettingzoo.test import api_test

import drmas_envs


@pytest.mark.parametrize("env_id", drmas_envs.list_envs())
def test_api_test(env_id):
    api_test(drmas_envs.make(env_id), num_cycles=30)


@pytest.mark.parametrize("env_id", drmas_envs.list_envs())
def test_pettingzoo_make(env_id):
    env = pettingzoo.make("aec", f"drmas/{env_id}-v0")
    env.reset(seed=0)
    agent = env.agent_selection
    assert agent in env.possible_agents
    assert env.observation_space(agent).contains(env.observe(agent))


def test_list_envs_verbose_describes_each():
    lines = drmas_envs.list_envs(verbose=True)
    assert len(lines) == len(drmas_envs.list_envs()) and all(": " in line for line in lines)
    assert {"math-1agent", "math-2agent"} <= set(drmas_envs.list_envs())
