"""The plan's data section: which train and eval sets a config names, their sizes, and how long their prompts are.

Datasets are loaded the way a run loads them (`drmas_envs.make` with the config's env options, and
the held-out options of `drmas_train.config.EvalConfig` for validation). A set that cannot be loaded
(no local copy, no hub) is reported by name with the loader's message and how to provide it; the
rest of the plan goes on without it.

Prompt lengths are measured on real prompts: for a sample of tasks the env builds every turn's
observation and the model's own chat template and tokenizer turn it into ids, as the rollout does.
First turns are exact. Later turns show earlier replies, which only a model can write: the walk
answers each call with a filler reply of exactly its response cap, so those prompts are the longest
the env can build (a bound, labelled so), whatever the replies say.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drmas_train.config import TrainConfig

HOW_TO_FETCH = (
    "put its files in a local data directory (env.kwargs.data_dir or $DRMAS_DATA_DIR) or run where the "
    "Hugging Face hub is reachable (docs/math.md and docs/search.md: which files each known name looks for)"
)
"""What the plan says after naming a dataset it could not load."""

CHARS_PER_TOKEN = 4.0
"""Without a tokenizer, token counts are estimated as characters / 4 (a common rule of thumb for
English BPE tokenizers, not measured here), and labelled as an estimate."""


@dataclass
class DatasetInfo:
    """One dataset as the plan reports it."""

    role: str
    """train or eval."""
    name: str
    """The dataset option (a known name or path), or a description of the generated set."""
    kwargs: dict[str, Any]
    """The env options it was loaded with (callables dropped)."""
    size: int | None = None
    """Tasks in the set; None when it could not be loaded."""
    sources: dict[str, int] = field(default_factory=dict)
    """Tasks per `source` label."""
    used: int | None = None
    """Tasks a run uses (validation: the first `eval.n_problems`)."""
    missing: str | None = None
    """Why it could not be loaded, and how to provide it; None when loaded."""


def _describe(kwargs: Mapping[str, Any]) -> str:
    dataset = kwargs.get("dataset")
    if dataset:
        split = kwargs.get("split")
        return f"{dataset}" + (f" ({split})" if split else "")
    split = kwargs.get("split") or "train"
    return f"generated (the env's built-in set, {split} split)"


def _plain(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if not callable(v)}


def load_env(env_id: str, kwargs: Mapping[str, Any], role: str) -> tuple[Any | None, DatasetInfo]:
    """Build the env as a run would; (env or None, its dataset's info)."""
    import drmas_envs

    info = DatasetInfo(role, _describe(kwargs), _plain(kwargs))
    try:
        env = drmas_envs.make(env_id, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError, KeyError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        from drmas_envs.data import data_dirs

        searched = ", ".join(str(d) for d in data_dirs(kwargs.get("data_dir"))) or "none set"
        info.missing = f"{info.name} not loaded: {message}. Local data directories searched: {searched}. "
        info.missing += f"To provide it: {HOW_TO_FETCH}"
        return None, info
    tasks = getattr(env.unwrapped, "tasks", None) or []
    info.size = len(tasks)
    info.sources = dict(Counter(str(t.get("source", "?")) for t in tasks if isinstance(t, Mapping)))
    return env, info


def eval_kwargs(env_kwargs: Mapping[str, Any], cfg: TrainConfig) -> dict[str, Any]:
    """The held-out env options validation uses (`drmas_train.run.validation.held_out_kwargs`' rule)."""
    out = dict(env_kwargs)
    if cfg.eval.split is not None:
        out["split"] = cfg.eval.split
    out.update(cfg.eval.env_kwargs)
    return out


@dataclass
class PromptStats:
    """Prompt lengths of one agent's calls against the prompt cap."""

    agent: str
    turn: str
    """first (exact: the env's first observation) or later (every earlier reply at its cap: a bound)."""
    n: int
    p50: float
    p99: float
    max: int
    truncated_share: float
    """Share of these prompts longer than `rollout.max_prompt_tokens` (the rollout cuts their middle)."""
    unit: str = "tokens"
    """tokens (the model's tokenizer) or 'tokens (estimate: characters / 4)'."""


def percentile_stats(agent: str, turn: str, lengths: Sequence[int], cap: int, unit: str) -> PromptStats:
    """p50, p99, max and the share over `cap` of a list of prompt lengths."""
    arr = np.asarray(lengths, dtype=float)
    return PromptStats(
        agent,
        turn,
        len(arr),
        float(np.percentile(arr, 50)),
        float(np.percentile(arr, 99)),
        int(arr.max()),
        float((arr > cap).mean()),
        unit,
    )


class PromptCounter:
    """Token length of an observation as the rollout feeds it: chat template, template options, reply prefix."""

    def __init__(self, tokenizer: Any | None, template_kwargs: Mapping[str, Any]):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs)
        self.unit = "tokens" if tokenizer is not None else f"tokens (estimate: characters / {CHARS_PER_TOKEN:g})"

    def __call__(self, obs: Mapping[str, Any]) -> int:
        messages = [{"role": "system", "content": obs["system"]}, {"role": "user", "content": obs["user"]}]
        prefix = obs.get("reply_prefix") or ""
        if self.tokenizer is None:
            return math.ceil((len(obs["system"]) + len(obs["user"]) + len(prefix)) / CHARS_PER_TOKEN)
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.template_kwargs
        )
        tail = self.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        return len(ids) + len(tail)

    def filler(self, n_tokens: int) -> str:
        """A reply of about `n_tokens` tokens (exactly, for tokenizers that read ' step' as one token)."""
        text = " step" * n_tokens
        if self.tokenizer is None:
            return text[: int(n_tokens * CHARS_PER_TOKEN)]
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:n_tokens]
        return self.tokenizer.decode(ids)


def walk_prompts(
    env: Any,
    task_indices: Sequence[int],
    counters: Mapping[str, PromptCounter],
    caps: Mapping[str, int],
    max_calls: int = 64,
) -> tuple[dict[tuple[str, str], list[int]], str | None]:
    """Prompt lengths per (agent, first|later) over episodes of the given tasks, every reply a filler at its cap.

    Returns:
        the lengths, and why the walk stopped early (None when every episode ran to its end).

    """
    lengths: dict[tuple[str, str], list[int]] = {}
    fillers = {a: counters[a].filler(caps[a]) for a in counters}
    for index in task_indices:
        env.reset(options={"task_index": int(index)})
        for _ in range(max_calls):
            if not env.agents:
                break
            agent = env.agent_selection
            if env.terminations.get(agent) or env.truncations.get(agent):
                env.step(None)  # AEC: a finished agent's only action
                continue
            obs = env.observe(agent)
            turn = "first" if int(obs.get("turn", 0)) == 0 else "later"
            lengths.setdefault((agent, turn), []).append(counters[agent](obs))
            try:
                env.step(fillers[agent])
            except (OSError, ValueError, RuntimeError) as exc:  # e.g. a retrieval service that is not running
                return lengths, f"later turns not built: {' '.join(str(exc).split())}"
    return lengths, None


def sample_indices(n_tasks: int, n: int, seed: int) -> list[int]:
    """`n` task indices (all when fewer), in a seeded random order."""
    order = np.random.default_rng(seed).permutation(n_tasks)
    return [int(i) for i in order[: min(n, n_tasks)]]
