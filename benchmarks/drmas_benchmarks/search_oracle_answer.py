"""Can the Answer agent read? search-2agent on the held-out worlds with the Search agent scripted to the gold
chain (or the model searching too) and a model answering: where EM stalls, this says whether reading fails.

The scripted Search agent searches the question's entity, then (two-hop) the middle entity or (single-hop)
the entity again, so with `topk: 2` the Answer agent sees every supporting passage; the model answers from
the env's own prompt (`prompt_layout`, `open_tags`, as in training) through the project's vLLM engine in
fp32. Reports EM per question source, greedy and sampled, and the share of Answer prompts that show every
supporting passage (1 with the scripted Search agent; with `--search model`, how often the model's own
searches found them).

    .venv/bin/python -m drmas_benchmarks.search_oracle_answer --model HuggingFaceTB/SmolLM2-135M-Instruct \
        [--search gold|model] [--n 64] [--k 4] [--split validation] [--prompts-file P.json] [--json OUT.json]

`--model` takes a Hugging Face id or a folder (`drmas-train export RUN --out DIR` makes one of a run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import drmas_envs
from drmas_benchmarks.search_chain_smollm2 import chat_texts
from drmas_benchmarks.search_policies import read_observation
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.resolve import resolve_model
from drmas_train.engines.vllm_backend import VLLMBackend

ENV = {"world": "held-out", "open_tags": True, "max_steps": 3, "topk": 2, "prompt_layout": "chain"}


def scripted_search(tasks: dict[str, dict], user: str) -> str:
    """The gold query for this step of the question in `user` (the env opened the `<search>` tag)."""
    question, steps = read_observation(user)
    task = tasks[question]
    query = task["entity"] if not steps else task.get("bridge", task["entity"])
    return f"{query}</search>"


def make_policy(
    engine,
    tasks: dict[str, dict],
    shown: list[bool],
    *,
    search: str,
    temperature: float,
    seed: int,
    first_prompt: list[dict] | None = None,
):
    """The Answer agent (and with `search="model"` the Search agent) from the model; `shown` gets, per Answer
    call, whether its prompt holds every supporting passage of the question; `first_prompt`, if given, the
    first Answer observation."""
    tok = engine.tokenizer

    def generate(observations: list[dict], stop: str) -> list[str]:
        params = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=24, stop=(stop,))
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in chat_texts(tok, observations)]
        return [g.text for g in engine.generate(ids, [params] * len(ids), seed=seed)]

    def policy(agent: str, observations: list[dict]) -> list[str]:
        if agent == "search":
            if search == "gold":
                return [scripted_search(tasks, o["user"]) for o in observations]
            return generate(observations, "</search>")
        if first_prompt is not None and not first_prompt:
            first_prompt.append(observations[0])
        for o in observations:
            question, steps = read_observation(o["user"])
            seen = {title for docs in steps for title, _ in docs}
            shown.append(set(tasks[question]["supporting_titles"]) <= seen)
        return generate(observations, "</answer>")

    return policy


def measure(
    engine, *, n: int, k: int, split: str = "validation", search: str = "gold", prompts_file: str | None = None
) -> dict:
    """EM and the share of Answer prompts showing every supporting passage, per hop count, greedy and (k > 0)
    sampled at T 0.6; each entry also keeps the first Answer prompt the model saw."""
    out = {}
    for hops in (1, 2):
        env_kwargs = {**ENV, "split": split, "hops": [hops]}
        if prompts_file:
            env_kwargs["prompts_file"] = prompts_file
        tasks = {t["question"]: t for t in drmas_envs.make("search-2agent", **env_kwargs).unwrapped.tasks}
        for name, temp, n_samples in (("greedy", 0.0, 1), ("sampled", 0.6, k))[: 2 if k else 1]:
            shown: list[bool] = []
            seen: list[dict] = []
            policy = make_policy(engine, tasks, shown, search=search, temperature=temp, seed=0, first_prompt=seen)
            res = drmas_envs.evaluate(policy, "search-2agent", k=n_samples, n_problems=n, **env_kwargs)
            out[f"hops{hops}/{name}"] = {
                "avg": res[f"avg@{n_samples}"],
                "supporting_shown": sum(shown) / max(1, len(shown)),
                "by_source": res["by_source"],
                "first_answer_prompt": seen[0] if seen else None,
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--n", type=int, default=64, help="questions per hop count")
    ap.add_argument("--k", type=int, default=4, help="sampled episodes per question (T 0.6); 0: greedy only")
    ap.add_argument("--split", default="validation")
    ap.add_argument("--search", choices=("gold", "model"), default="gold", help="who searches: the script or the model")
    ap.add_argument(
        "--prompts-file",
        help="the env's prompts_file (per-role templates) to measure instead of the layout's; the Answer user "
        "template must still open with 'Question: {question}\\n\\nSearch history:' (the script reads it)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    engine = VLLMBackend(resolve_model(args.model), dtype="float32")
    t0 = time.time()
    out = {
        "model": args.model,
        "search": args.search,
        "split": args.split,
        "env": ENV,
        "n_per_hop": args.n,
        "k": args.k,
        "prompts_file": args.prompts_file,
        **measure(engine, n=args.n, k=args.k, split=args.split, search=args.search, prompts_file=args.prompts_file),
    }
    out["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
