"""How long the held-out worlds' two-hop prompts are for SmolLM2-135M-Instruct (its tokenizer and chat template).

Plays search-2agent on the validation world's two-hop questions with a scripted team that searches the
question's entity, then the middle entity, then answers, and counts the tokens of each prompt the model
would get (system and user message in the chat template, the reply's opened tag included), for the
`project` and `chain` layouts and 1, 2 or 3 passages a search. `rollout.max_prompt_tokens` must hold them.

    .venv/bin/python -m drmas_benchmarks.search_prompt_tokens [--every 5] [--out OUT.md]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from transformers import AutoTokenizer

import drmas_envs
from drmas_train.engines.resolve import resolve_model


def prompt_tokens(tok, observation: dict) -> int:
    """Tokens of one call's prompt as the engines build it: chat template, generation prompt, opened tag."""
    chat = [{"role": "system", "content": observation["system"]}, {"role": "user", "content": observation["user"]}]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + observation["reply_prefix"]
    return len(tok(text, add_special_tokens=False)["input_ids"])


def measure(tok, layout: str, topk: int, every: int) -> dict[str, list[int]]:
    """Prompt lengths per call (first search, second search, answer) over every `every`-th two-hop question."""
    env = drmas_envs.make("search-2agent", world="held-out", split="validation", hops=[2], prompt_layout=layout,
                          open_tags=True, max_steps=3, topk=topk)  # fmt: skip
    out: dict[str, list[int]] = {"search 1": [], "search 2": [], "answer": []}
    for i in range(0, len(env.tasks), every):
        task = env.tasks[i]
        env.reset(options={"task_index": i})
        out["search 1"].append(prompt_tokens(tok, env.observe("search")))
        env.step(f"{task['entity']}</search>")
        out["search 2"].append(prompt_tokens(tok, env.observe("search")))
        env.step(f"{task['bridge']}</search>")
        out["answer"].append(prompt_tokens(tok, env.observe("answer")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=5, help="every n-th two-hop question of the validation world")
    ap.add_argument("--out", default="benchmarks/results/search_prompt_tokens.md")
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"))
    lines = [f"# {__doc__.splitlines()[0]}", "", " ".join(__doc__.split("\n\n")[1].split()), ""]
    lines += ["| layout | passages a search | call | questions | min | median | max |", "|---|---|---|---|---|---|---|"]
    for layout in ("project", "chain"):
        for topk in (1, 2, 3):
            for call, lengths in measure(tok, layout, topk, args.every).items():
                row = f"{len(lengths)} | {min(lengths)} | {statistics.median(lengths):.0f} | {max(lengths)}"
                lines.append(f"| {layout} | {topk} | {call} | {row} |")
    lines += ["", "Reproduce: `.venv/bin/python -m drmas_benchmarks.search_prompt_tokens`", ""]
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
