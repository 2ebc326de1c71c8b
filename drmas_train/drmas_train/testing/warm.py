"""Warm tiny models: a few supervised steps on an env's own prompts with well-formed replies.

A random model never writes a well-formed output, so every call gets the same reward, every
advantage is 0 and nothing trains. A tiny model briefly fitted to the env's formats samples a mix
of well-formed and malformed (and right and wrong) outputs: the smallest model on which a smoke run
exercises the whole algorithm. Used by the `tiny-math` model name (the smoke preset).
"""

from __future__ import annotations

import random
from pathlib import Path

import drmas_envs
from drmas_train.testing.tiny import build_tiny_model


def math_chats(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """`n` chats from math-2agent's real prompts: solver replies box an answer (right 2 times in 3),
    verifier replies give a verdict (twice as many of those).
    """
    rng = random.Random(seed)
    env = drmas_envs.make("math-2agent", level=[1], n_per_level=200)
    chats = []
    while len(chats) < n:
        env.reset(options={"task_index": rng.randrange(len(env.unwrapped.tasks))})
        answer = str(env.unwrapped.workflow.task["answer"])
        guess = answer if rng.random() < 2 / 3 else str(rng.randint(0, 9))
        for agent, reply in (("solver", f"The answer is \\boxed{{{guess}}}"), ("verifier", None)):
            obs = env.observe(agent)
            if reply is None:
                reply = "<verify>approve</verify>" if guess == answer else "<verify>reject</verify>"
            chat = [{"role": "system", "content": obs["system"]}, {"role": "user", "content": obs["user"]}]
            # The verifier's tag is longer to learn than a box: it gets two examples per episode.
            chats.extend([[*chat, {"role": "assistant", "content": reply}]] * (2 if agent == "verifier" else 1))
            env.step(reply)
    return chats[:n]


def build_tiny_math_model(out_dir: str | Path | None = None, *, arch: str = "llama", steps: int = 70) -> Path:
    """A tiny model fitted for `steps` steps to math-2agent's formats (cached like `build_tiny_model`)."""
    return build_tiny_model(out_dir, arch=arch, sft_steps=steps, sft_chats=math_chats(16 * steps))
