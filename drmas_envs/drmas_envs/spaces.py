"""Text spaces that PettingZoo's API test accepts.

`gymnasium.spaces.Text` only admits a fixed charset and a minimum length of 1, so "x = 1+1?" or
"Zürich" are not members. Model output is arbitrary unicode, so the spaces here accept any `str`
up to a length bound, and sample short printable strings (the API test samples actions).
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARSET = string.ascii_letters + string.digits + " <>/{}\\()=+-*.,?!"


class AnyText(spaces.Text):
    """Any Python string of at most `max_length` characters (unicode and empty included)."""

    def __init__(self, max_length: int, *, sample_length: int = 48, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=_SAMPLE_CHARSET, seed=seed)
        self.sample_length = min(sample_length, max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, self.sample_length + 1))
        chars = self.np_random.choice(np.array(list(_SAMPLE_CHARSET)), size=n)
        return "".join(chars.tolist())

    def __repr__(self) -> str:
        return f"AnyText({self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AnyText) and other.max_length == self.max_length


def observation_space(max_turns: int, max_length: int) -> spaces.Dict:
    """The observation of one agent: its role, its [system, user] chat, its reply's given start, the turn index."""
    text = AnyText(max_length)
    return spaces.Dict(
        {
            "role": AnyText(64),
            "system": text,
            "user": text,
            "reply_prefix": text,
            "turn": spaces.Discrete(max_turns + 1),
        }
    )


def action_space(max_length: int) -> AnyText:
    """An action is the agent's raw text output."""
    return AnyText(max_length)
