"""The workflow base and WorkflowEnv on a tiny two-role workflow defined here."""

import pytest
from pettingzoo.test import api_test

import drmas_envs
from drmas_envs import Parsed, PromptTemplate, Score, Workflow, WorkflowEnv


class Relay(Workflow):
    """`a` says a word, `b` repeats it; two rounds; the team scores if b repeated a's first word."""

    roles = ("a", "b")
    default_prompts = {
        "a": PromptTemplate("You are A.", "Say {word}."),
        "b": PromptTemplate("You are B.", "A said: {last}"),
    }

    def first_role(self):
        return "a"

    def parse(self, role, text):
        return Parsed(valid=bool(text.strip()), value=text.strip(), error="" if text.strip() else "empty")

    def transition(self, role, parsed):
        if role == "a":
            return "b"
        return None if len(self.history) >= 4 else "a"

    def context(self, role):
        return {"word": self.task["word"], "last": self.history[-1].text if self.history else ""}

    def score(self):
        b_calls = self.calls_of("b")
        return Score(float(bool(b_calls) and b_calls[0].parsed.value == self.task["word"]), {"said": b_calls[0].text})


def make_env(**kw):
    return WorkflowEnv(Relay, [{"word": "hi"}, {"word": "yo"}, {"word": "ok"}], **kw)


def test_api_test_passes():
    api_test(make_env(format_penalty=0.1), num_cycles=50)


def test_rewards_and_infos_at_end():
    env = make_env(format_penalty={"a": 0.5, "b": 0.25})
    env.reset(options={"task_index": 0})
    script = {"a": ["hi", ""], "b": ["hi", ""]}
    results = drmas_envs.run_lockstep([env], lambda agent, idx, obs: [script[agent].pop(0)])
    res = results[0]
    assert res.rewards == {"a": 1.0 - 0.5, "b": 1.0 - 0.25}
    info = res.info
    assert info["team_reward"] == 1.0
    assert [c["agent"] for c in info["calls"]] == ["a", "b", "a", "b"]
    assert [c["valid"] for c in info["calls"]] == [True, True, False, False]
    assert info["calls_per_agent"] == {"a": 2, "b": 2}
    assert info["said"] == "hi"


def test_observation_carries_role_and_chat():
    env = make_env()
    env.reset(options={"task_index": 1})
    obs = env.observe("a")
    assert obs["role"] == "a" and obs["system"] == "You are A." and obs["user"] == "Say yo."
    assert env.observation_space("a").contains(obs)


def test_seeded_task_order_is_deterministic():
    env = make_env()
    words = []
    for seed in (3, 3):
        env.reset(seed=seed)
        words.append(env.unwrapped.workflow.task["word"])
    assert words[0] == words[1]
    assert env.unwrapped.task_order(3) == env.unwrapped.task_order(3)


def test_unknown_env_id_names_known_ones():
    with pytest.raises(KeyError, match="math-2agent"):
        drmas_envs.make("no-such-env")


def test_template_values_are_not_parsed():
    # model text full of braces must reach the next prompt verbatim
    env = make_env()
    env.reset(options={"task_index": 0})
    env.step("{word} {0} }{")
    assert env.observe("b")["user"] == "A said: {word} {0} }{"
