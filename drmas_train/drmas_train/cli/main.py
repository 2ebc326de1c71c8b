"""`drmas-train`: train a team of LLM agents with Dr. MAS, evaluate one (`drmas-train eval`), or plan a run (`plan`).

drmas-train --env math-2agent                       # the cpu preset (SmolLM2, offline)
drmas-train --env search-2agent                     # the cpu-search preset (SmolLM2, the generated world)
drmas-train --preset smoke --run-dir runs/smoke     # a tiny model, 2 steps
drmas-train --preset cpu --steps 5 --set learner.lr=1e-5 --agents.verifier.temperature 0.7
drmas-train --run-dir runs/cpu --resume             # continue after a crash or kill -9
drmas-train --preset smoke --placement shared       # models in Ray workers on one pool (local Ray)
drmas-train eval --checkpoint runs/cpu --json       # the run's last checkpoint, validated as in training
drmas-train plan --preset math-2x-qwen3-4b          # data, prompt lengths, memory per GPU, time: no GPU needed
drmas-train export runs/cpu --out exported/         # each trained model as a Hugging Face folder
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drmas_train.cli.args import CONFIG_ERRORS, SETUP_ERRORS, check_saved_env, parse_train_args, report_error
from drmas_train.config import build_config, default_preset

console = Console(stderr=True)


def _preset_for(args: argparse.Namespace, overrides: dict[str, Any]) -> str:
    """The explicit preset; on --resume the run's own config.yaml; else the env's CPU default (`default_preset`)."""
    if args.preset:
        return args.preset
    run_dir = overrides.get("log.run_dir")
    if args.resume and run_dir and (Path(run_dir) / "config.yaml").is_file():
        return str(Path(run_dir) / "config.yaml")
    return default_preset(overrides.get("env.id"))


def _val_summary(row: dict[str, Any]) -> str:
    """The headline validation figures of a row: sampled avg@k / pass@k, greedy avg@1 and answer_acc."""
    keys = [k for k in row if k.startswith(("val/avg@", "val/pass@")) or k == "val/answer_acc"]
    return " ".join(f"{k[4:]} {row[k]:.2f}" for k in keys)


def _before_after(first: dict[str, Any], last: dict[str, Any]) -> str:
    """Each headline and per-agent validation figure, first -> last (per-source rows left to metrics.jsonl)."""
    per_source = [k for k in first if "/avg@" in k and not k.startswith("val/avg@")]
    keys = [k for k in first if k.startswith("val/") and k in last and k not in per_source and k != "val/n_problems"]
    keys = [k for k in keys if not k.startswith("val/grade/")]  # counts, in metrics.jsonl
    return "; ".join(f"{k[4:]} {first[k]:.3f} -> {last[k]:.3f}" for k in keys)


def _progress_line(row: dict[str, Any], agents: list[str], last_val: dict[str, Any] | None = None) -> str:
    parts = [f"reward {row['reward/team']:.2f}", f"acc {row['accuracy']:.2f}"]
    if last_val:
        parts.append(f"val@{last_val['step']} {_val_summary(last_val)}")
    for a in agents:
        parts.append(f"{a}: r {row.get(f'reward/{a}', 0):.2f} valid {row.get(f'valid/{a}', 0):.2f}{_no_signal(row, a)}")
    grads = [f"{k.split('/', 1)[1]} {v:.3g}" for k, v in row.items() if k.startswith("grad_norm/")]
    parts.append("|g| " + ", ".join(grads))
    if "grade/errors" in row:
        parts.append(f"grade err {row['grade/errors']} over budget {row['grade/over_budget']}")
    parts.append(f"{row['time/step']:.1f}s/step")
    return " | ".join(parts)


def eta(elapsed_s: float, steps_done: int, steps_left: int) -> str:
    """The time to the run's last step at the mean step time of this process so far (validations included)."""
    if steps_done <= 0:
        return "ETA -"
    s = round(elapsed_s / steps_done * steps_left)
    return f"ETA {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _no_signal(row: dict[str, Any], agent: str) -> str:
    """The agent's shares of calls in one-sample keys (solo) and all-equal-reward keys (flat): no signal."""
    solo, flat = row.get(f"groups/{agent}/singleton_share"), row.get(f"groups/{agent}/zero_var_share")
    return "" if solo is None or flat is None else f" solo {solo:.2f} flat {flat:.2f}"


def _quiet_transformers() -> None:
    """Hide transformers' per-file progress bars (loading, saving); our own bar reports progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def train_main(argv: list[str]) -> int:
    args, overrides = parse_train_args(argv)
    _quiet_transformers()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        preset = _preset_for(args, overrides)
        cfg = build_config(preset, overrides)
        if preset.endswith("config.yaml") and args.resume:  # a run folder's own config: code it names is not run
            check_saved_env(cfg.env.id, overrides.get("env.id"), preset)
    except CONFIG_ERRORS as exc:
        report_error(console, "config error", exc, args.verbose)
        return 2
    if args.print_config:
        import yaml

        from drmas_train.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    from drmas_envs import EnvNotFoundError
    from drmas_envs.math.grading import WorkerStartError
    from drmas_train.placement.failures import WorkerDiedError
    from drmas_train.run.grading import GradingError
    from drmas_train.run.outage import ServiceOutageError
    from drmas_train.run.trainer import Trainer

    try:
        trainer = Trainer(cfg, resume=args.resume, trust_checkpoint=args.trust_checkpoint)
    except WorkerDiedError as exc:  # a placed run's worker died while loading: one line naming it
        report_error(console, "error", exc, args.verbose)
        return 3
    except EnvNotFoundError as exc:  # --env names no env, module or attribute: one line, no traceback
        report_error(console, "env error", exc, args.verbose)
        return 2
    except SETUP_ERRORS as exc:  # bad data, a missing file or package: one line, no traceback
        report_error(console, "error", exc, args.verbose)
        return 1
    except WorkerStartError as exc:  # math-verify missing or failing its self-check at the reference check
        report_error(console, "error", exc, args.verbose)
        return 5
    console.print(
        f"[bold]drmas-train[/bold] env {cfg.env.id} | agents {trainer.agents} | policies "
        f"{list(trainer.policies)} ({cfg.models.assignment}, placement {cfg.placement.mode}) | "
        f"estimator {cfg.algo.estimator} | "
        f"run dir {cfg.log.run_dir}"
    )
    columns = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("rolling out...", total=cfg.steps, completed=trainer.step)
        last_val: dict[str, Any] = {}
        first_step, started = trainer.step, time.monotonic()

        def on_step(row: dict[str, Any]) -> None:
            if trainer.initial_validation and not last_val:
                last_val.update(trainer.initial_validation)
                progress.console.print(f"validation before training: {_val_summary(last_val)}")
            if any(k.startswith("val/") for k in row):
                last_val.clear()
                last_val.update(row)
                progress.console.print(f"validation at step {row['step']}: {_val_summary(row)}")
            line = _progress_line(row, trainer.agents, last_val)
            line += " | " + eta(time.monotonic() - started, row["step"] - first_step, cfg.steps - row["step"])
            progress.update(task, completed=row["step"], description=line)

        try:
            rows = trainer.train(on_step)
        except WorkerDiedError as exc:  # one line naming the worker and the step; --resume continues
            progress.stop()
            report_error(console, "error", exc, args.verbose)
            return 3
        except ServiceOutageError as exc:  # the env's retrieval service down: one line naming its URL
            progress.stop()
            report_error(console, "error", exc, args.verbose)
            return 4
        except GradingError as exc:  # too many of a step's grades were errors: one line naming the references
            progress.stop()
            report_error(console, "error", exc, args.verbose)
            return 5
    if rows:
        last = rows[-1]
        console.print(f"done: step {last['step']}, {_progress_line(last, trainer.agents)}")
        if trainer.initial_validation and last_val:
            console.print("validation, before -> after: " + _before_after(trainer.initial_validation, last_val))
        console.print(
            f"peak RSS {last['mem/peak_rss_mb']:.0f} MiB; metrics in {Path(cfg.log.run_dir) / 'metrics.jsonl'}"
        )
    return 0


def eval_main(argv: list[str]) -> int:
    from drmas_envs import EnvNotFoundError
    from drmas_train.cli.eval import eval_parser, report_table, run_eval, stdout_to_stderr

    args = eval_parser().parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the result alone
    _quiet_transformers()
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])
    try:
        with stdout_to_stderr():
            result = run_eval(args)
    except EnvNotFoundError as exc:
        report_error(console, "env error", exc)
        return 2
    except SETUP_ERRORS as exc:
        report_error(console, "error", exc)
        return 1
    except RuntimeError as exc:  # the env's retrieval service down: one line naming it
        from drmas_train.run.outage import service_error

        cause = service_error(exc)
        if cause is None:
            raise
        report_error(console, "error", cause)
        return 4
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if args.json else report_table(result))
    return 0


def plan_main(argv: list[str]) -> int:
    from drmas_envs import EnvNotFoundError
    from drmas_train.cli.plan import dumps, parse_plan_args, run_plan
    from drmas_train.plan.report import render

    args, overrides = parse_plan_args(argv)
    _quiet_transformers()
    handler = RichHandler(console=console, level=logging.WARNING)  # a library logging at DEBUG stays quiet
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])
    try:
        plan = run_plan(args, overrides)
    except (EnvNotFoundError, *CONFIG_ERRORS) as exc:
        report_error(console, "config error", exc, args.verbose)
        return 2
    except SETUP_ERRORS as exc:
        report_error(console, "error", exc, args.verbose)
        return 1
    print(dumps(plan) if args.json else render(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `drmas-train` and `python -m drmas_train`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "eval":
        return eval_main(argv[1:])
    if argv and argv[0] == "plan":
        return plan_main(argv[1:])
    if argv and argv[0] == "export":
        from drmas_train.cli.export import export_main

        return export_main(argv[1:])
    return train_main(argv)
