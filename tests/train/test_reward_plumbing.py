"""The trainer's rollout and the plain PettingZoo loop see the same per-call rewards.

The same envs are played twice, by the same replies: once through `agent_iter()` / `last()`, once
through `drmas_train.rollout.rollout`. Agents call several times (a rejected Solver, several
searches), some calls malformed. The replies come from a *scripted policy* (`ScriptedTextBackend`,
which implements the real `Backend` protocol and picks a fixed text from the prompt it is given): what
is tested is reward plumbing, not generation. A second test replays a real tiny model's rollout
through the AEC loop.
"""

import re
from collections.abc import Callable

import pytest
import torch
from transformers import AutoTokenizer

import drmas_envs
from drmas_train.config import build_config
from drmas_train.engines.assignment import Policy
from drmas_train.engines.base import Backend, Generation, SamplingParams
from drmas_train.rollout import chat_prompt, rollout
from drmas_train.run.trainer import Trainer
from drmas_train.testing.tiny import build_tiny_model

MAX_PROMPT = 1_000_000  # no prompt loses its middle: the script reads the whole prompt
GROUP = 2


class ScriptedTextBackend:
    """A scripted policy behind the real `Backend` protocol: `script(prompt text) -> reply text`.

    The prompt ids are decoded and the reply is encoded with the real tokenizer, so the rollout
    records real ids; log-probs are 0 (nothing is sampled, and nothing here trains on them).
    """

    def __init__(self, tokenizer, script: Callable[[str], str]):
        self.tokenizer = tokenizer
        self.script = script

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        out = []
        for ids in prompts:
            text = self.script(self.tokenizer.decode(list(ids)))
            reply = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(ids), reply, [0.0] * len(reply), text))
        return out

    def load_weights(self, named_tensors):
        """A script has no weights to load."""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


# -- the scripts: the reply depends on the role (system prompt), the task and the turn --------------------
def math_script(text: str) -> str:
    """Case i of the dataset: mode i % 4 (see EXPECTED_MATH)."""
    case = int(re.search(r"Case (\d+):", text).group(1))
    mode, answer = case % 4, case + 1
    attempts = text.count("[Solver, attempt")
    if "You are the Verifier" in text:
        return {
            0: "<verify>approve</verify>",
            1: "<verify>reject</verify>",
            2: "no verdict",
            3: "<verify>reject</verify>",
        }[mode]
    if attempts == 0:
        return {0: f"\\boxed{{{answer}}}", 1: "\\boxed{0}", 2: "no box", 3: "\\boxed{0}"}[mode]
    return f"\\boxed{{{answer}}}" if mode in (1, 2) else "still no box"


# (agent, reward) per call, by mode; solver penalty 0.1, verifier 0.5
EXPECTED_MATH = {
    0: [("solver", 1.0), ("verifier", 1.0)],
    1: [("solver", 1.0), ("verifier", 1.0), ("solver", 1.0)],
    2: [("solver", 0.9), ("verifier", 0.5), ("solver", 1.0)],
    3: [("solver", 0.0), ("verifier", 0.0), ("solver", -0.1)],
}


def make_search_script(golds: dict[str, str]) -> Callable[[str], str]:
    """Mode by question (the order of `golds`): 0 right after two searches, 1 malformed calls and a
    wrong forced answer after three searches, 2 a malformed answer after one search."""
    modes = {q: i % 3 for i, q in enumerate(golds)}

    def script(text: str) -> str:
        question = text.rsplit("Question: ", 1)[1].split("\n", 1)[0]
        mode, gold = modes[question], golds[question]
        searches = len(re.findall(r"^Step \d+: ", text, re.M))
        if "You are the Verifier" in text:
            if mode == 1:
                return "I cannot tell"
            return "<verify>yes</verify>" if searches >= (2 if mode == 0 else 1) else "<verify>no</verify>"
        if "You are the Search agent" in text:
            return "I would search" if mode == 1 and searches == 0 else f"<search>{question}</search>"
        return {0: f"<answer>{gold}</answer>", 1: "<answer>nobody at all</answer>", 2: "the answer"}[mode]

    return script


def search_expected(mode: int, p: float) -> list[tuple[str, float]]:
    if mode == 0:
        return [("verifier", 1.0), ("search", 1.0)] * 2 + [("verifier", 1.0), ("answer", 1.0)]
    if mode == 1:
        return [("verifier", -p), ("search", -p), ("verifier", -p), ("search", 0.0), ("verifier", -p)] + [
            ("search", 0.0),
            ("answer", 0.0),
        ]
    return [("verifier", 0.0), ("search", 0.0), ("verifier", 0.0), ("answer", -p)]


# -- the two loops ---------------------------------------------------------------------------------------
def aec_episode(env, reply: Callable[[str, dict], str], task_index: int):
    """One episode through agent_iter()/last(); returns (final infos' calls, {agent: last() reward})."""
    env.reset(options={"task_index": task_index})
    rewards, info = {}, None
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, last_info = env.last()
        if terminated or truncated:
            rewards[agent], info = reward, last_info
            env.step(None)
        else:
            env.step(reply(agent, obs))
    return info["calls"], rewards, info


def scripted_rollout(envs, tasks, backend, tokenizer):
    agents = envs[0].possible_agents
    # the rollout never runs the module: an empty one stands in for the weights a script does not have
    policy = Policy("scripted", torch.nn.Module(), tokenizer, backend, list(agents))
    serving = {a: policy for a in agents}
    sampling = {a: SamplingParams(max_new_tokens=64) for a in agents}
    return rollout(envs, tasks, GROUP, serving, sampling, seed=0, max_prompt_tokens=MAX_PROMPT)


def check_same_rewards(batch, make_env, tasks, reply):
    """Per episode: the rollout's records carry exactly the per-call rewards the AEC loop's infos give."""
    seen = []
    for e, episode in enumerate(batch.episodes):
        calls, aec_rewards, info = aec_episode(make_env(), reply, tasks[e // GROUP])
        records = [r for r in batch.records if r.episode_id == e]
        assert [(r.agent, r.reward, r.valid, r.stratum) for r in records] == [
            (c["agent"], c["reward"], c["valid"], c["stratum"]) for c in calls
        ]
        assert episode.info["calls"] == calls and episode.rewards == aec_rewards
        for agent, reward in aec_rewards.items():  # AEC reward = team - the sum of the agent's calls' penalties
            penalties = sum(c["penalty"] for c in calls if c["agent"] == agent)
            assert reward == pytest.approx(info["team_reward"] - penalties)
        seen.append([(c["agent"], round(c["reward"], 9)) for c in calls])
    return seen


def test_math_2agent_rejected_solver_same_rewards_both_loops(tmp_path, tokenizer):
    dataset = tmp_path / "cases.jsonl"
    dataset.write_text("".join(f'{{"problem": "Case {i}: what is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(4)))
    kwargs = {"dataset": str(dataset), "missing_verdict": "reject", "format_penalty": {"solver": 0.1, "verifier": 0.5}}

    def make_env():
        return drmas_envs.make("math-2agent", **kwargs)

    assert isinstance(ScriptedTextBackend(tokenizer, math_script), Backend)
    tasks = [0, 1, 2, 3]
    envs = [make_env() for _ in range(len(tasks) * GROUP)]
    batch = scripted_rollout(envs, tasks, ScriptedTextBackend(tokenizer, math_script), tokenizer)

    def reply(agent, obs):
        return math_script(tokenizer.decode(chat_prompt(tokenizer, obs, MAX_PROMPT)))

    seen = check_same_rewards(batch, make_env, tasks, reply)
    problems = make_env().unwrapped.tasks
    for e, calls in enumerate(seen):
        case = int(re.search(r"Case (\d+)", problems[tasks[e // GROUP]]["problem"]).group(1))
        assert calls == EXPECTED_MATH[case % 4]
        # the Verifier's call carries the grade of the attempt it reviewed (only mode 0's is right)
        strata = [r.stratum for r in batch.records if r.episode_id == e]
        assert strata == [None, "right" if case % 4 == 0 else "wrong"] + [None] * (len(strata) - 2)
    assert {r.agent for r in batch.records if not r.valid} == {"solver", "verifier"}


def test_search_3agent_several_searches_same_rewards_both_loops(tokenizer):
    penalty = 0.25

    def make_env():
        return drmas_envs.make("search-3agent", format_penalty=penalty)  # the generated world, BM25

    probe = make_env().unwrapped
    tasks = probe.task_order(0)[:3]
    golds = {probe.tasks[t]["question"]: probe.tasks[t]["golden_answers"][0] for t in tasks}
    script = make_search_script(golds)
    envs = [make_env() for _ in range(len(tasks) * GROUP)]
    batch = scripted_rollout(envs, tasks, ScriptedTextBackend(tokenizer, script), tokenizer)

    def reply(agent, obs):
        return script(tokenizer.decode(chat_prompt(tokenizer, obs, MAX_PROMPT)))

    seen = check_same_rewards(batch, make_env, tasks, reply)
    for e, calls in enumerate(seen):
        assert calls == search_expected((e // GROUP) % 3, penalty)
    assert [ep.info["correct"] for ep in batch.episodes] == [True, True, False, False, False, False]


@pytest.mark.parametrize(
    "env_id, kwargs",
    [("math-2agent", {"env.kwargs.missing_verdict": "reject"}), ("search-3agent", {"models.assignment": "per_agent"})],
)
def test_real_tiny_model_rollout_replayed_through_the_aec_loop(tmp_path, env_id, kwargs):
    # A real tiny model samples; replaying each episode's recorded texts through agent_iter()/last()
    # gives the same per-call rewards the trainer recorded.
    overrides = {"log.run_dir": str(tmp_path / "run"), "models.backend": "transformers", "env.id": env_id, **kwargs}
    cfg = build_config("smoke", overrides)
    trainer = Trainer(cfg)
    try:
        tasks = [0, 1]
        batch = rollout(trainer.envs, tasks, cfg.rollout.group_size, trainer.serving, trainer.sampling, seed=5)
    finally:
        trainer.close()
    for e, episode in enumerate(batch.episodes):
        texts = [r.text for r in batch.records if r.episode_id == e]
        env = drmas_envs.make(env_id, **trainer.env_kwargs)
        calls, rewards, _ = aec_episode(
            env, lambda agent, obs, texts=texts: texts.pop(0), tasks[e // cfg.rollout.group_size]
        )
        assert not texts
        records = [r for r in batch.records if r.episode_id == e]
        assert [(r.agent, r.reward, r.valid, r.stratum) for r in records] == [
            (c["agent"], c["reward"], c["valid"], c["stratum"]) for c in calls
        ]
        assert episode.rewards == rewards
    counts = [len([r for r in batch.records if r.episode_id == e]) for e in range(len(batch.episodes))]
    assert max(counts) >= 3  # some agent called more than once in some episode
