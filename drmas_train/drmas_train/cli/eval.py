"""`drmas-train eval`: avg@k and pass@k of a training checkpoint or a model, per data source.

It runs the validation of training (`drmas_train.run.validation.evaluate_team`): the same held-out envs,
engines, prompts and sampling. With `--checkpoint DIR` the run is rebuilt from its `config.yaml` (env id
and options, held-out split, stop strings, response and prompt caps, the cut side, chat-template
options, models, engine and its dtype, validation protocol) and the checkpoint's weights are loaded,
so with no flags it reproduces the run's last validation. With `--model M` every agent runs on M, the
rest set by a preset (`--preset`, default cpu). Flags override either.

Standard output carries the result alone (a table, or one JSON object with `--json`); logs, the
engines' included, go to standard error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drmas_envs.cli import EVAL_DEFAULTS, add_eval_arguments
from drmas_envs.evaluate import result_table
from drmas_train.cli.args import check_saved_env
from drmas_train.config import (
    BackendName,
    TrainConfig,
    Truncation,
    build_config,
    choices,
    default_preset,
    parse_assignment,
)
from drmas_train.config.help import field_choices

log = logging.getLogger(__name__)

_FROM_RUN = "the run's, or the preset's"


def eval_parser() -> argparse.ArgumentParser:
    """The argument parser of `drmas-train eval`; its evaluation flags are `drmas-envs eval`'s."""
    p = argparse.ArgumentParser(
        prog="drmas-train eval",
        description=__doc__.split("\n\n")[0],
        epilog="An unset flag takes the run's config.yaml value (--checkpoint) or the preset's (--model): with "
        "no flags a checkpoint is evaluated exactly as its run validated it. --env-arg options add to the "
        "held-out set's. Exit status: 1 a data, model or checkpoint error, 2 an unknown env.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", default=None, help="runs/<run>/checkpoints/step-N, or a run dir (its latest)")
    src.add_argument("--model", default=None, help="HF id, local folder or tiny name, for every agent")
    p.add_argument(
        "--preset",
        default=None,
        help="with --model: the preset that sets the rest (default: cpu; cpu-search for --env search-*)",
    )
    p.add_argument("--env", default=None, help=f"env id, e.g. math-2agent (default: {_FROM_RUN})")
    add_eval_arguments(p, dict.fromkeys(EVAL_DEFAULTS), unset=_FROM_RUN)
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longer prompts are cut (--truncation)")
    p.add_argument(
        "--truncation",
        choices=choices(Truncation),
        default=None,
        help="the part of a long prompt cut: middle (keep head and tail), left (keep the tail), right, error",
    )
    p.add_argument(
        "--greedy", action=argparse.BooleanOptionalAction, default=None, help="also one greedy episode per problem"
    )
    p.add_argument("--device", default=None, help="cpu, cuda or auto")
    p.add_argument("--backend", default=None, choices=choices(BackendName), help="generation engine")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (0: torch's default)")
    p.add_argument(
        "--placement",
        default=None,
        choices=field_choices("placement.mode"),
        help="shared: the problems split over placement.shared_pool.ranks engine replicas (Ray); none (default, "
        "whatever the run used): this process",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any config field")
    return p


def checkpoint_paths(path: str) -> tuple[Path, Path]:
    """(checkpoint folder, the run's config.yaml) of a checkpoint folder or a run dir (its latest checkpoint)."""
    from drmas_train.run.checkpoint import latest_checkpoint

    folder = Path(path)
    if (folder / "config.yaml").is_file():
        latest = latest_checkpoint(folder / "checkpoints")
        if latest is None:
            raise FileNotFoundError(f"{folder} has no complete checkpoint under checkpoints/")
        return latest, folder / "config.yaml"
    config = folder.parent.parent / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: --checkpoint expects <run_dir>/checkpoints/step-N or <run_dir>")
    return folder, config


def _overrides(args: argparse.Namespace, agents: list[str]) -> dict[str, Any]:
    """The config fields the flags set (dotted keys); a reply flag also replaces `agents`' own values."""
    flags = {
        "env.id": args.env,
        "models.name": args.model,
        "models.device": args.device,
        "models.backend": args.backend,
        "threads": args.threads,
        "rollout.max_prompt_tokens": args.max_prompt_tokens,
        "rollout.truncation": args.truncation,
        "rollout.max_new_tokens": args.max_new_tokens,
        "rollout.stop": args.stop,
        "eval.k": args.k,
        "eval.n_problems": args.n_problems,
        "eval.temperature": args.temperature,
        "eval.top_p": args.top_p,
        "eval.seed": args.seed,
        "eval.batch_episodes": args.batch_episodes,
        "eval.greedy": args.greedy,
        "eval.split": args.split,
        "eval.env_kwargs.dataset": args.dataset,
        "placement.mode": args.placement,
    }
    out = dict(parse_assignment(item) for item in args.set)  # as training: the named flags win
    out.update({key: value for key, value in flags.items() if value is not None})
    out.setdefault("placement.mode", "none")  # a placed run's checkpoint is evaluated here unless asked
    out.update({f"eval.env_kwargs.{key}": value for key, value in args.env_arg})
    for agent in agents:
        for field in ("max_new_tokens", "stop"):
            if f"rollout.{field}" in out:
                out[f"agents.{agent}.{field}"] = out[f"rollout.{field}"]
    if args.max_new_tokens is not None or args.max_prompt_tokens is not None:
        out["models.engine.max_model_len"] = None  # derived again from the new caps
    return out


def eval_config(args: argparse.Namespace) -> tuple[TrainConfig, Path | None]:
    """The run's (or the preset's) config with the flags applied, and the checkpoint folder (None with --model)."""
    if args.checkpoint is not None:
        if args.preset is not None:
            raise ValueError("--preset goes with --model; a checkpoint's run sets everything (--checkpoint)")
        folder, base = checkpoint_paths(args.checkpoint)
    else:
        folder, base = None, args.preset or default_preset(args.env)
    cfg = build_config(str(base), _overrides(args, []))
    if folder is not None:  # the run folder's config: a module it names is not imported unless named again
        check_saved_env(cfg.env.id, args.env, str(base))
    own = [a for a, o in cfg.agents.items() if o.max_new_tokens is not None or o.stop is not None]
    if own and (args.max_new_tokens is not None or args.stop is not None):
        cfg = build_config(str(base), _overrides(args, own))
    return cfg, folder


def build_team(cfg: TrainConfig, agents: list[str], folder: Path | None) -> dict[str, Any]:
    """The policy serving each agent: the run's models, with the checkpoint's weights when `folder` is set
    (the weights alone: no optimizer or RNG state is read).
    """
    from drmas_train.engines.assignment import agent_to_policy, build_policies, resolve_engine
    from drmas_train.learner.policy_ops import load_policy_weights, sync_engine
    from drmas_train.rollout.versions import WeightClock, version_engines
    from drmas_train.run.checkpoint import load_model_weights
    from drmas_train.run.eval_pool import engine_dtype

    resolve_engine(cfg.models)
    ranks = {a: o.lora_rank for a, o in cfg.agents.items() if o.lora_rank is not None}
    # the modules in the engine's dtype: what generates, or (vLLM) what pushes into the engine
    models = dataclasses.replace(cfg.models, dtype=engine_dtype(cfg))
    policies = build_policies(models, agents, seed=cfg.seed, lora_ranks=ranks)
    if cfg.models.engine.sleep:  # each generation wakes its engine with the module's weights
        from drmas_train.engines.sleep import sleep_engines

        sleep_engines(policies)
    if folder is not None:
        for name, policy in policies.items():  # one model's tensors at a time, mapped from the file
            load_policy_weights(policy, load_model_weights(folder, [name], mmap=True)[name])
            sync_engine(policy)  # a vLLM engine holds its own copy of the weights
        # the checkpoint's weights are the run's version `step`, as its validation reported them
        step = json.loads((folder / "state.json").read_text())["step"]
        version_engines(policies.values(), WeightClock(int(step)))
    return agent_to_policy(policies)


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as the run validated (module docstring); `evaluate_team`'s result plus the settings used.

    The result's "metrics" are the `val/*` row the trainer logs to metrics.jsonl, for comparison.
    """
    import drmas_envs
    from drmas_train.learner.policy_ops import seed_everything
    from drmas_train.run import validation

    cfg, folder = eval_config(args)
    if cfg.threads > 0:
        import torch

        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    probe = drmas_envs.make(cfg.env.id, **cfg.env.kwargs)
    agents = list(probe.possible_agents)
    env_kwargs = validation.team_env_kwargs(cfg, probe)
    envs = validation.make_eval_envs(cfg.env.id, env_kwargs, cfg.eval)  # data errors before any model loads
    sampling = {a: validation.agent_sampling(cfg, a) for a in agents}
    options = validation.prompt_options(cfg, agents)
    placed = {}
    if cfg.placement.mode == "none":
        result = validation.evaluate_team(envs, build_team(cfg, agents, folder), sampling, cfg.eval, **options)
    else:
        from drmas_train.run.eval_pool import start_engine_pool

        pool = start_engine_pool(cfg, agents, folder)
        try:
            result = validation.evaluate_team(envs, pool.serving, sampling, cfg.eval, **options)
            placed = {"rows_per_replica": pool.rows_per_replica()}
        finally:
            pool.close()
    e = cfg.eval
    return {
        "env": cfg.env.id,
        "source": str(folder if folder is not None else cfg.models.name),
        "env_kwargs": validation.held_out_kwargs(env_kwargs, e),
        "temperature": e.temperature,
        "top_p": e.top_p,
        "seed": e.seed,
        **result,
        "metrics": validation.metrics_row(result),
        **placed,
    }


def report_table(result: dict[str, Any]) -> str:
    """The result as text: a header line, the sampled pass's table and the greedy pass's."""
    k = result["k"]
    lines = [
        f"{result['env']} | {result['source']} | k={k} T={result['temperature']} top-p={result['top_p']}",
        result_table(result, k),
    ]
    if "greedy" in result:
        lines += ["greedy:", result_table(result["greedy"], 1)]
    return "\n".join(lines)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what this process, and any process it starts, writes to stdout to stderr instead.

    Engines print and log to stdout (vLLM's logger, its engine process); redirecting the file
    descriptor keeps standard output for the result alone.
    """
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout to protect
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
