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
        temperature: the temperature the call sampled at (0: greedy). The learner scores the
            response under softmax(logits / temperature), as the engine that sampled it did
            (`score_temperature`), so the PPO ratio is 1 on-policy at any temperature.
        stratum: the env's label of the situation the call acted in (the math Verifier's: the grade
            of the attempt it reviewed); None for most calls (`algo.balance_strata`).
        weight_version: the version of the weights that sampled it: how many training steps they had
            taken (0: the initial weights); None where the engine is not versioned. A step trained on
            weights of version v sees the call `v - weight_version` versions stale (`rollout.max_staleness`).

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
    temperature: float = 1.0
    stratum: str | None = None
    weight_version: int | None = None

    @property
    def score_temperature(self) -> float:
        """The temperature the learner scores this call at: its sampling temperature, 1 for greedy calls.

        A greedy call (temperature 0) has no sampling distribution; engines report its raw log-probs
        (vLLM does, and so does the transformers backend), which is temperature 1.
        """
        return self.temperature if self.temperature > 0 else 1.0
