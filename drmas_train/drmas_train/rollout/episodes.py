"""Rollout: B tasks x n episodes in lock-step, one generation batch per engine per round.

Each call's prompt is the model's chat template applied once to the observation's [system, user];
the ids fed to the engine and the ids it sampled are recorded as they are (never re-tokenised),
so the learner trains on exactly what was sampled, turn by turn. Per-call rewards are read from the
env's final infos, never recomputed here: `info["calls"]` lists the calls in the order they were made
(the order recorded here), each with its `reward` (team reward, minus the agent's format penalty on a
malformed call) and `valid` flag; see `drmas_envs.env`.

Every call samples with a seed of its own (`call_seed`: the rollout's seed, the round, the episode and
the agent), so a call's response does not depend on which engine batch it ran in, nor on how a
data-parallel pool split that batch across its ranks' engines.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pettingzoo import AECEnv

from drmas_envs import EpisodeResult, run_lockstep
from drmas_train.algorithm.records import CallRecord
from drmas_train.config import Truncation
from drmas_train.engines.assignment import Policy
from drmas_train.engines.base import SamplingParams


@dataclass
class RolloutBatch:
    """What one step's rollout produced."""

    records: list[CallRecord]
    episodes: list[EpisodeResult]
    group_of: list[int]  # episode -> prompt group
    task_of: list[int]  # episode -> task index
    gen_seconds: float = 0.0
    prompt_seconds: float = 0.0  # building prompt ids (chat template + tokeniser)
    rounds: int = 0
    stats: dict[str, float] = field(default_factory=dict)


def chat_prompt(
    tokenizer: Any,
    observation: Mapping[str, Any],
    max_tokens: int,
    template_kwargs: Mapping[str, Any] | None = None,
    truncation: Truncation = "middle",
) -> list[int]:
    """Token ids of the observation's [system, user] chat with the generation prompt appended.

    A prompt longer than `max_tokens` is cut as `truncation` says (verl's `data.truncation`): "middle"
    keeps its head (the system prompt) and its tail (the latest context and the assistant header),
    "left" keeps the tail, "right" keeps the head, "error" raises ValueError. `template_kwargs` are
    variables for the chat template (e.g. `enable_thinking=False` for Qwen3: `models.chat_template_kwargs`).
    The observation's `reply_prefix` (the start of the reply written for the model) follows the
    generation prompt, so the model continues it; it is never cut.
    """
    messages = [{"role": "system", "content": observation["system"]}, {"role": "user", "content": observation["user"]}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **dict(template_kwargs or {})
    )
    prefix = observation.get("reply_prefix") or ""
    tail = list(tokenizer.encode(prefix, add_special_tokens=False)) if prefix else []
    return truncate(list(ids), max_tokens - len(tail), truncation) + tail


def truncate(ids: list[int], budget: int, side: Truncation) -> list[int]:
    """`ids` cut to `budget` tokens on the given side ("middle", "left", "right"; "error" raises)."""
    if len(ids) <= budget:
        return ids
    if side == "middle":
        head = budget // 2
        return ids[:head] + ids[len(ids) - (budget - head) :]
    if side == "left":
        return ids[len(ids) - budget :]
    if side == "right":
        return ids[:budget]
    raise ValueError(  # error
        f"a prompt of {len(ids)} tokens is longer than the {budget} allowed "
        "(rollout.max_prompt_tokens, less any reply prefix); raise it or set rollout.truncation"
    )


def call_seed(seed: int, round_index: int, episode: int, agent: str) -> int:
    """The sampling seed of one call: a hash of its identity in the rollout, in [0, 2**63).

    Args:
        seed: the rollout's seed (the trainer's: `cfg.seed * 100_003 + step`).
        round_index: the lock-step round the call is made in.
        episode: the episode index e (group e // n).
        agent: the calling agent.

    """
    key = f"{seed}/{round_index}/{episode}/{agent}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def reset_envs(envs: Sequence[AECEnv], tasks: Sequence[int], group_size: int) -> None:
    """Episode e = b * group_size + j runs task `tasks[b]`."""
    if len(envs) != len(tasks) * group_size:
        raise ValueError(f"{len(envs)} envs for {len(tasks)} tasks x {group_size} episodes")
    for e, env in enumerate(envs):
        env.reset(options={"task_index": int(tasks[e // group_size])})


def rollout(
    envs: Sequence[AECEnv],
    tasks: Sequence[int],
    group_size: int,
    serving: Mapping[str, Policy],
    sampling: Mapping[str, SamplingParams],
    *,
    seed: int,
    max_prompt_tokens: int = 2048,
    template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    truncation: Truncation = "middle",
) -> RolloutBatch:
    """Run B = len(tasks) groups of `group_size` episodes and record every call.

    Args:
        envs: B * n envs (reset here).
        tasks: the task index of each group.
        group_size: n, the episodes per task.
        serving: agent -> the policy that serves it.
        sampling: agent -> its sampling settings.
        seed: base seed of this rollout's sampling (each call derives its own: `call_seed`).
        max_prompt_tokens: longer prompts are cut (`truncation`).
        template_kwargs: agent -> its chat-template variables (`TrainConfig.template_kwargs`).
        truncation: which part of an over-long prompt is cut (`chat_prompt`).

    Returns:
        The records (rewards filled, advantages not yet) and the episodes' final results.

    """
    reset_envs(envs, tasks, group_size)
    per_episode: list[list[CallRecord]] = [[] for _ in envs]
    state = {"round": 0, "gen": 0.0, "prompt": 0.0}

    def act_round(pending: dict[str, list[int]], observations: dict[str, list[dict]]) -> dict[str, list[str]]:
        # Group this round's calls by engine: agents that share a model (or a LoRA base) share a batch.
        jobs: dict[int, list[tuple[str, int, int, dict]]] = {}
        for agent, idx in pending.items():
            engine = id(serving[agent].backend)
            for k, (e, obs) in enumerate(zip(idx, observations[agent])):
                jobs.setdefault(engine, []).append((agent, k, e, obs))
        answers = {agent: [""] * len(idx) for agent, idx in pending.items()}
        for calls in jobs.values():
            first = serving[calls[0][0]]
            t_prompt = time.perf_counter()
            prompts = [
                chat_prompt(serving[a].tokenizer, obs, max_prompt_tokens, (template_kwargs or {}).get(a), truncation)
                for a, _, _, obs in calls
            ]
            t0 = time.perf_counter()
            state["prompt"] += t0 - t_prompt
            gens = first.backend.generate(
                prompts,
                [sampling[a] for a, *_ in calls],
                adapters=[serving[a].adapter for a, *_ in calls],
                seed=[call_seed(seed, state["round"], e, a) for a, _, e, _ in calls],
            )
            state["gen"] += time.perf_counter() - t0
            for (agent, k, e, obs), gen in zip(calls, gens):
                policy = serving[agent]
                record = CallRecord(
                    group_id=e // group_size,
                    episode_id=e,
                    agent=agent,
                    model=policy.name,
                    turn=len(per_episode[e]),
                    prompt_ids=gen.prompt_ids,
                    response_ids=gen.response_ids,
                    logprobs=gen.logprobs,
                    adapter=policy.adapter,
                    text=gen.text,
                    temperature=sampling[agent].temperature,  # the learner scores at it
                    weight_version=gen.version,
                    extra={
                        "system": obs["system"],
                        "user": obs["user"],
                        "reply_prefix": obs.get("reply_prefix", ""),
                        "finish": gen.finish_reason,
                    },
                )
                per_episode[e].append(record)
                answers[agent][k] = gen.text
        state["round"] += 1
        return answers

    episodes = run_lockstep(envs, act_round=act_round)
    for result, records in zip(episodes, per_episode):
        assign_rewards(records, result)
    return RolloutBatch(
        records=[r for records in per_episode for r in records],
        episodes=episodes,
        group_of=[e // group_size for e in range(len(envs))],
        task_of=[int(tasks[e // group_size]) for e in range(len(envs))],
        gen_seconds=state["gen"],
        prompt_seconds=state["prompt"],
        rounds=state["round"],
    )


def assign_rewards(records: Sequence[CallRecord], result: EpisodeResult) -> None:
    """Give each recorded call the reward and validity the env reported for it in the final infos.

    Raises:
        RuntimeError: the env's call list does not match the recorded calls, or carries no per-call
            rewards (an env that is not a `drmas_envs.WorkflowEnv`, or a broken one).

    """
    episode = records[0].episode_id if records else "?"
    calls = result.info.get("calls")
    if calls is None or any("reward" not in c or "valid" not in c for c in calls):
        raise RuntimeError(
            f"episode {episode}: the env's final infos carry no per-call rewards "
            "(infos['calls'][i]['reward'] and ['valid']); train a drmas_envs.WorkflowEnv"
        )
    if [c["agent"] for c in calls] != [r.agent for r in records]:
        raise RuntimeError(
            f"episode {episode}: env reports calls "
            f"{[c['agent'] for c in calls]} but the rollout recorded {[r.agent for r in records]}"
        )
    for record, call in zip(records, calls):
        record.valid = bool(call["valid"])
        record.reward = float(call["reward"])
        record.stratum = call.get("stratum")
        if call.get("error"):
            record.extra["error"] = call["error"]
