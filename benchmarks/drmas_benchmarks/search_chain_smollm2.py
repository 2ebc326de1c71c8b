"""Where untrained SmolLM2-135M-Instruct starts on the held-out worlds: the start of a two-hop CPU run.

Plays search-2agent (`world="held-out"`, the validation world, the env opening each reply's tag, 2 searches
of 2 passages, then the answer) greedily, with the "project" and the "chain" prompt layouts, on single- and
two-hop questions. Reports EM per source and how the Search agent's queries start: the first query is the
question's entity, the second the middle entity of a two-hop question (what the chain examples teach).

    .venv/bin/python -m drmas_benchmarks.search_chain_smollm2 [--n 8] [--out OUT.md]
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch

import drmas_envs
from drmas_benchmarks.search_format_smollm2 import load_smollm2

ENV = {"world": "held-out", "split": "validation", "open_tags": True, "max_steps": 3, "topk": 2}
CLOSE = re.compile(r"</(search|answer|verify)>")


def chat_texts(tok, observations: list[dict]) -> list[str]:
    """Each observation as the chat template renders it, the env's reply prefix after the generation prompt."""
    return [
        tok.apply_chat_template(
            [{"role": "system", "content": o["system"]}, {"role": "user", "content": o["user"]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        + o["reply_prefix"]
        for o in observations
    ]


def make_policy(tok, model, max_new_tokens: int, seen: list):
    """Greedy replies that continue the env's reply prefix and stop at the first closing tag."""

    @torch.no_grad()
    def policy(agent: str, observations: list[dict]) -> list[str]:
        texts = chat_texts(tok, observations)
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        outs = tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        outs = [o[: m.end()] if (m := CLOSE.search(o)) else o for o in outs]
        seen.extend((agent, o["user"], out) for o, out in zip(observations, outs))
        return outs

    return policy


def query_shares(seen: list, tasks: dict[str, dict]) -> tuple[float, float]:
    """(first queries that are the question's entity, second queries that are the middle entity) among searches."""
    first, second = [], []
    for agent, user, out in seen:
        if agent != "search":
            continue
        question = re.search(r"Question: (.*?)\n", user).group(1)
        query, task = out.removesuffix("</search>").strip(), tasks[question]
        steps = user.count("<search>")
        (first if steps == 0 else second).append(query == (task["entity"] if steps == 0 else task.get("bridge")))
    return sum(first) / max(1, len(first)), sum(second) / max(1, len(second))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="questions per hop count")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--out", default="benchmarks/results/search_chain_smollm2.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    tok, model = load_smollm2()
    lines = [f"# {__doc__.splitlines()[0]}", "", " ".join(__doc__.split("\n\n")[1].split()), ""]
    lines += ["| prompt layout | hops | EM (greedy) | first query = entity | second query = middle entity | s |"]
    lines += ["|---|---|---|---|---|---|"]
    for layout in ("project", "chain"):
        for hops in (1, 2):
            env = {**ENV, "prompt_layout": layout, "hops": [hops]}
            tasks = {t["question"]: t for t in drmas_envs.make("search-2agent", **env).unwrapped.tasks}
            seen: list = []
            t0 = time.time()
            res = drmas_envs.evaluate(make_policy(tok, model, args.max_new_tokens, seen), "search-2agent", k=1,
                                      n_problems=args.n, **env)  # fmt: skip
            first, second = query_shares(seen, tasks)
            second_cell = f"{second:.3f}" if hops == 2 else "-"
            lines.append(
                f"| {layout} | {hops} | {res['avg@1']:.3f} | {first:.3f} | {second_cell} | {time.time() - t0:.0f} |"
            )
    lines += ["", f"{args.n} questions per row (the validation world's first, in evaluate's seed-0 order); "
              f"torch {torch.__version__}, float32, CPU.", "",
              "Reproduce: `.venv/bin/python -m drmas_benchmarks.search_chain_smollm2`", ""]  # fmt: skip
    Path(args.out).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
