"""Does SmolLM2-135M-Instruct (the CPU default model) follow the search envs' formats, with and without examples?

Runs search-3agent (the embedded generated world, BM25) through `drmas_envs.evaluate` twice: with the
default prompts, which end with short worked examples, and with the same prompts cut before their
examples. Reports, per agent, the share of well-formed calls (the env's own format check) at the
sampling temperature of training, and avg@k. A well-formed share near 0 for every agent means every
call gets the same reward, so group-normalised advantages are all 0 and training has no signal.

    .venv/bin/python -m drmas_benchmarks.search_format_smollm2 [--env search-3agent] [--n 16] [--k 2] \
        [--temperature 1.0] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import drmas_envs
from drmas_benchmarks.math_levels_smollm2 import make_policy
from drmas_envs.search.prompts import ONE_AGENT, THREE_AGENT, TWO_AGENT
from drmas_envs.workflow import PromptTemplate
from drmas_train.engines.resolve import resolve_model

PROMPTS = {"search-3agent": THREE_AGENT, "search-2agent": TWO_AGENT, "search-1agent": ONE_AGENT}


def load_smollm2() -> tuple[AutoTokenizer, AutoModelForCausalLM]:
    """SmolLM2-135M-Instruct in fp32 for batched generation: its tokenizer (padding on the left) and model."""
    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return tok, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def without_examples(prompts: dict[str, PromptTemplate]) -> dict[str, PromptTemplate]:
    """The same templates with their system prompts cut before the worked examples."""
    return {role: PromptTemplate(system=t.system.split("\n\nExample")[0], user=t.user) for role, t in prompts.items()}


def well_formed(env_id: str, seen: list[tuple[str, str, str]]) -> dict[str, float]:
    """Per agent, the share of its outputs the env's format check accepts."""
    env = drmas_envs.make(env_id)
    env.reset(seed=0)
    workflow = env.unwrapped.workflow
    ok: dict[str, list[bool]] = defaultdict(list)
    for agent, _, out in seen:
        ok[agent].append(workflow.parse(agent, out).valid)
    return {a: sum(v) / len(v) for a, v in sorted(ok.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="search-3agent", choices=sorted(PROMPTS))
    ap.add_argument("--n", type=int, default=16, help="questions")
    ap.add_argument("--k", type=int, default=2, help="episodes per question")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok, model = load_smollm2()
    print(f"{args.env}, {args.n} questions x k={args.k}, temperature {args.temperature}, {args.max_new_tokens} tokens")
    print("| prompts | " + " | ".join(f"{a} well-formed (calls)" for a in PROMPTS[args.env]) + f" | avg@{args.k} |")
    print("|---|" + "---|" * (len(PROMPTS[args.env]) + 1))
    for label, prompts in (("without examples", without_examples(PROMPTS[args.env])), ("default", None)):
        policy, seen = make_policy(tok, model, args.max_new_tokens, args.batch, args.temperature)
        kwargs = {"prompts": prompts} if prompts is not None else {}
        t0 = time.time()
        res = drmas_envs.evaluate(policy, args.env, k=args.k, n_problems=args.n, **kwargs)
        rates = well_formed(args.env, seen)
        calls = defaultdict(int)
        for agent, _, _ in seen:
            calls[agent] += 1
        cells = [f"{rates.get(a, 0.0):.3f} ({calls[a]})" for a in PROMPTS[args.env]]
        print(f"| {label} | " + " | ".join(cells) + f" | {res[f'avg@{args.k}']:.3f} |  ({time.time() - t0:.0f} s)")
        print("  sample outputs:", [(agent, out[:120]) for agent, _, out in seen[:3]], flush=True)


if __name__ == "__main__":
    main()
