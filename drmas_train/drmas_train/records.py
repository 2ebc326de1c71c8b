"""The call record: the one training sample that rollout produces and the learner consumes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CallRecord:
    """One model call by one agent in one episode.

    Attributes:
        group_id: the prompt group (the n episodes sampled from one task share it).
        episode_id: the episode, unique within a step.
        agent: the logical agent (the advantage key, also when agents share a model).
        model: the model the call ran on.
        turn: the call's index in its episode.
        prompt_ids: the prompt token ids exactly as fed to the engine.
        response_ids: the response token ids exactly as sampled.
        logprobs: the sampling log-probs of `response_ids`.
        valid: whether the output was well-formed (malformed calls are penalised).
        reward: team reward minus this call's format penalty (filled at episode end).
        advantage: filled by the estimator.
        adapter: the LoRA adapter the call ran with, if any.
        text: the decoded response, for trajectory logs.

    """

    group_id: int
    episode_id: int
    agent: str
    model: str
    turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    valid: bool = True
    reward: float = 0.0
    advantage: float = 0.0
    adapter: str | None = None
    text: str = ""
    extra: dict = field(default_factory=dict)
