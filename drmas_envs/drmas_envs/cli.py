"""`drmas-envs`: list the environments, and benchmark any OpenAI-compatible served model on them.

    drmas-envs list
    drmas-envs eval --env math-2agent --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-4B --k 16

`eval` prints avg@k and pass@k overall and per data source (or one JSON object with `--json`); its
evaluation flags (`add_eval_arguments`) are `drmas-train eval`'s too. Per-agent sampling:
`--agent verifier:temperature=0,max_tokens=64` (repeatable). Env arguments that have no flag of their
own: `--env-arg key=value` (repeatable; values are read as JSON when they parse).
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
from drmas_envs.evaluate import evaluate, result_table
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


class DeprecatedAlias(argparse.Action):
    """An old spelling of a flag: sets the new flag's value and says so on stderr."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        print(f"{parser.prog}: {option} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


EVAL_DEFAULTS: dict[str, Any] = {
    "k": 16,
    "n_problems": None,
    "seed": 0,
    "temperature": 0.6,
    "top_p": 0.95,
    "max_new_tokens": 1024,
    "batch_episodes": 256,
}
"""The defaults of `drmas-envs eval`'s protocol flags: the paper's sampled evaluation (k 16, T 0.6, top-p 0.95)."""


def add_eval_arguments(
    p: argparse.ArgumentParser, defaults: dict[str, Any] | None = None, *, unset: str = "all"
) -> None:
    """The evaluation flags `drmas-envs eval` and `drmas-train eval` share, with the same names.

    Args:
        p: the parser to add them to.
        defaults: flag dest -> default (`EVAL_DEFAULTS` when None); a None default leaves the flag unset.
        unset: what an unset flag means, shown in its help (e.g. "the run's").

    """
    d = EVAL_DEFAULTS if defaults is None else defaults

    def add(flag: str, kind: type, text: str) -> None:
        dest = flag[2:].replace("-", "_")
        shown = d[dest] if d[dest] is not None else unset
        p.add_argument(flag, type=kind, default=d[dest], help=f"{text} (default: {shown})")

    add("--k", int, "episodes per problem: avg@k and pass@k")
    add("--n-problems", int, "the first N problems in the seed's order")
    p.add_argument("--dataset", default=None, help="a known dataset name or a JSONL path (the env's default if unset)")
    p.add_argument("--split", default=None, help="dataset split")
    add("--seed", int, "problem order and sampling seed")
    add("--temperature", float, "sampling temperature, 0 greedy (paper: 0.6)")
    add("--top-p", float, "nucleus sampling mass (paper: 0.95)")
    add("--max-new-tokens", int, "longest reply in tokens")
    p.add_argument("--max-tokens", type=int, dest="max_new_tokens", action=DeprecatedAlias, new="--max-new-tokens")
    p.add_argument(
        "--stop", action="append", default=None, metavar="STRING", help="a string that ends a reply (repeatable)"
    )
    add("--batch-episodes", int, "episodes stepped in lock-step at once")
    p.add_argument(
        "--env-arg",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="env kwarg (repeatable; a JSON value or text)",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object instead of a table")
    p.add_argument("--output", default=None, help="also write the result as JSON to this file")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `drmas-envs`."""
    parser = argparse.ArgumentParser(prog="drmas-envs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the registered environments")
    ev = sub.add_parser("eval", help="avg@k and pass@k of a served model (OpenAI-compatible chat completions)")
    ev.add_argument("--env", required=True, help="env id, e.g. math-2agent")
    ev.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="API root of the server")
    ev.add_argument("--model", required=True, help="the served model name")
    add_eval_arguments(ev)
    ev.add_argument(
        "--agent",
        type=_agent_sampling,
        action="append",
        default=[],
        metavar="AGENT:KEY=VALUE[,...]",
        help=f"per-agent sampling override; keys: {', '.join(sorted(_SAMPLING_KEYS))}",
    )
    ev.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    ev.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one response")
    ev.add_argument("--retries", type=int, default=3, help="retries of a failed request (errors 408/429/5xx, timeouts)")
    ev.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    return parser


def _eval(args: argparse.Namespace) -> int:
    base = ChatSampling(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_new_tokens, stop=tuple(args.stop or ())
    )
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
        print(result_table(result, args.k))
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
