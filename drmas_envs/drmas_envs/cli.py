"""`drmas-envs`: list the environments, and benchmark any OpenAI-compatible served model on them.

    drmas-envs list
    drmas-envs eval --env math-2agent --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-4B --k 16

`eval` prints avg@k and pass@k overall and per data source (or JSON with `--json`). Per-agent
sampling: `--agent verifier:temperature=0,max_tokens=64` (repeatable). Env arguments that have no
flag of their own: `--env-arg key=value` (repeatable; values are read as JSON when they parse).
Exit status: 0 done, 1 the server (or the data, or writing --output) failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from drmas_envs.data import DataError
from drmas_envs.evaluate import evaluate
from drmas_envs.openai_policy import ChatSampling, OpenAIChatPolicy, OpenAIPolicyError
from drmas_envs.registry import list_envs

_SAMPLING_KEYS = {f.name: f.type for f in fields(ChatSampling) if f.name not in ("extra", "stop")}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), _value(value)


def _agent_sampling(text: str) -> tuple[str, dict[str, Any]]:
    agent, sep, rest = text.partition(":")
    if not sep or not agent or not rest:
        raise argparse.ArgumentTypeError(f"expected AGENT:key=value[,key=value...], got {text!r}")
    settings = dict(_key_value(item) for item in rest.split(","))
    unknown = sorted(set(settings) - set(_SAMPLING_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sampling keys {unknown}; known: {sorted(_SAMPLING_KEYS)}")
    return agent.strip(), settings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `drmas-envs`."""
    parser = argparse.ArgumentParser(prog="drmas-envs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered environments")
    ev = sub.add_parser("eval", help="avg@k and pass@k of a served model (OpenAI-compatible chat completions)")
    ev.add_argument("--env", required=True, help="env id, e.g. math-2agent")
    ev.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="API root of the server")
    ev.add_argument("--model", required=True, help="the served model name")
    ev.add_argument("--k", type=int, default=16, help="episodes per problem")
    ev.add_argument("--n-problems", type=int, default=None, help="evaluate only the first N problems (seed's order)")
    ev.add_argument("--dataset", default=None, help="a known dataset name or a JSONL path (the env's default if unset)")
    ev.add_argument("--split", default=None, help="dataset split")
    ev.add_argument("--seed", type=int, default=0, help="problem order; also the first request seed")
    ev.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (0: greedy; paper: 0.6)")
    ev.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (paper: 0.95)")
    ev.add_argument("--max-tokens", type=int, default=1024, help="longest reply in tokens")
    ev.add_argument(
        "--agent",
        type=_agent_sampling,
        action="append",
        default=[],
        metavar="AGENT:KEY=VALUE[,...]",
        help=f"per-agent sampling override; keys: {', '.join(sorted(_SAMPLING_KEYS))}",
    )
    ev.add_argument("--env-arg", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="env kwarg")
    ev.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    ev.add_argument("--batch-episodes", type=int, default=256, help="episodes stepped in lock-step at once")
    ev.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one response")
    ev.add_argument("--retries", type=int, default=3, help="retries of a failed request (errors 408/429/5xx, timeouts)")
    ev.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    ev.add_argument("--output", default=None, help="also write the result as JSON to this file")
    return parser


def _table(result: dict[str, Any], k: int) -> str:
    rows = [("all", result)] + list(result["by_source"].items())
    width = max(len(name) for name, _ in rows)
    lines = [f"{'source':<{width}}  {'problems':>8}  {f'avg@{k}':>8}  {f'pass@{k}':>8}"]
    for name, r in rows:
        lines.append(f"{name:<{width}}  {r['n_problems']:>8}  {r[f'avg@{k}']:>8.4f}  {r[f'pass@{k}']:>8.4f}")
    return "\n".join(lines)


def _eval(args: argparse.Namespace) -> int:
    base = ChatSampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    per_agent = {agent: replace(base, **settings) for agent, settings in args.agent}
    env_kwargs = dict(args.env_arg)
    if args.dataset is not None:
        env_kwargs["dataset"] = args.dataset
    if args.split is not None:
        env_kwargs["split"] = args.split
    policy = OpenAIChatPolicy(
        args.base_url,
        args.model,
        sampling=base,
        agent_sampling=per_agent,
        api_key=args.api_key,
        max_concurrency=args.concurrency,
        timeout=args.timeout,
        max_retries=args.retries,
        seed=args.seed,
    )
    start = time.perf_counter()
    with policy:
        result = evaluate(
            policy,
            args.env,
            k=args.k,
            n_problems=args.n_problems,
            seed=args.seed,
            batch_episodes=args.batch_episodes,
            **env_kwargs,
        )
    elapsed = time.perf_counter() - start
    report = {
        "env": args.env,
        "k": args.k,
        "env_kwargs": env_kwargs,
        "policy": policy.describe(),
        "usage": vars(policy.usage),
        "seconds": round(elapsed, 2),
        **result,
    }
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.env} | {args.model} @ {args.base_url} | k={args.k} | {elapsed:.1f} s")
        print(_table(result, args.k))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `drmas-envs` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for line in list_envs(verbose=True):
            print(line)
        return 0
    # Exit status: 1 when the run fails (the server, the data, writing --output), 2 for bad arguments
    # (unknown env or dataset name, bad value), as argparse's own usage errors.
    try:
        return _eval(args)
    except OpenAIPolicyError as e:
        return _fail(f"the server failed: {e}", 1)
    except (DataError, OSError) as e:
        return _fail(str(e), 1)
    except (KeyError, ValueError) as e:
        return _fail(str(e), 2)


def _fail(message: str, status: int) -> int:
    """One line on stderr; returns `status`."""
    print(f"drmas-envs eval: {' '.join(message.split())}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
