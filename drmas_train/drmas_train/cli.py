"""`drmas-train`: train a team of LLM agents with Dr. MAS, or evaluate one (`drmas-train eval`).

drmas-train --env math-2agent                       # the cpu preset (SmolLM2, offline)
drmas-train --preset smoke --run-dir runs/smoke     # a tiny model, 2 steps
drmas-train --preset cpu --steps 5 --set learner.lr=1e-5 --agents.verifier.temperature 0.7
drmas-train --run-dir runs/cpu --resume             # continue after a crash or kill -9
drmas-train --preset smoke --placement shared       # models in Ray workers on one pool (local Ray)
drmas-train eval --env math-2agent --k 16 --checkpoint runs/cpu/checkpoints/step-000030
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drmas_train.config import BACKENDS, build_config, list_presets, parse_assignment
from drmas_train.placement import MODES

console = Console(stderr=True)


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="drmas-train",
        description="Train a team of LLM agents with agent-wise GRPO (Dr. MAS). Subcommand: eval.",
        epilog=f"presets: {', '.join(list_presets())}. Any config field: --set section.field=value "
        "or --section.field value (e.g. --learner.lr 1e-5).",
    )
    p.add_argument("--preset", default=None, help="a shipped preset or a YAML file (default: cpu)")
    p.add_argument("--env", default=None, help="env id (env.id), e.g. math-2agent, search-3agent")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    p.add_argument("--estimator", default=None, help="drmas | grpo | pooled | rloo")
    p.add_argument("--assignment", default=None, help="shared | per_agent | heterogeneous | lora")
    p.add_argument("--model", default=None, help="models.name: HF id, local folder, or tiny")
    p.add_argument("--backend", default=None, choices=BACKENDS, help="generation engine (models.backend)")
    p.add_argument(
        "--placement",
        default=None,
        choices=MODES,
        help="where the models run (placement.mode): none (this process), shared (one Ray pool), per_agent",
    )
    p.add_argument("--ray-address", default=None, help='join this Ray cluster ("auto", "ray://head:10001")')
    p.add_argument("--run-dir", default=None, help="where logs and checkpoints go (log.run_dir)")
    p.add_argument("--seed", type=int, default=None, help="seed of data order, sampling and init")
    p.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any config field")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def parse_train_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse plain flags, `--set k=v` and dotted flags (`--a.b v` / `--a.b=v`) into overrides."""
    parser = _train_parser()
    args, rest = parser.parse_known_args(argv)
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "." not in tok.split("=", 1)[0]:
            parser.error(f"unrecognised argument {tok!r}")
        if "=" in tok:
            key, value = parse_assignment(tok[2:])
        elif i + 1 < len(rest):
            key, value = parse_assignment(f"{tok[2:]}={rest[i + 1]}")
            i += 1
        else:
            parser.error(f"{tok} needs a value")
        overrides[key] = value
        i += 1
    for item in args.set:
        key, value = parse_assignment(item)
        overrides[key] = value
    plain = {
        "env.id": args.env,
        "steps": args.steps,
        "algo.estimator": args.estimator,
        "models.assignment": args.assignment,
        "models.name": args.model,
        "models.backend": args.backend,
        "placement.mode": args.placement,
        "placement.ray_address": args.ray_address,
        "log.run_dir": args.run_dir,
        "seed": args.seed,
    }
    overrides.update({k: v for k, v in plain.items() if v is not None})
    return args, overrides


def _preset_for(args: argparse.Namespace, overrides: dict[str, Any]) -> str:
    """The explicit preset; on --resume the run's own config.yaml; else the cpu preset."""
    if args.preset:
        return args.preset
    run_dir = overrides.get("log.run_dir")
    if args.resume and run_dir and (Path(run_dir) / "config.yaml").is_file():
        return str(Path(run_dir) / "config.yaml")
    return "cpu"


def _progress_line(row: dict[str, Any], agents: list[str]) -> str:
    parts = [f"reward {row['reward/team']:.2f}", f"acc {row['accuracy']:.2f}"]
    for a in agents:
        parts.append(f"{a}: r {row.get(f'reward/{a}', 0):.2f} valid {row.get(f'valid/{a}', 0):.2f}")
    grads = [f"{k.split('/', 1)[1]} {v:.3g}" for k, v in row.items() if k.startswith("grad_norm/")]
    parts.append("|g| " + ", ".join(grads))
    parts.append(f"{row['time/step']:.1f}s/step")
    return " | ".join(parts)


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
        cfg = build_config(_preset_for(args, overrides), overrides)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        console.print(f"[red]config error:[/red] {exc}")
        return 2
    if args.print_config:
        import yaml

        from drmas_train.config import to_dict

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    from drmas_train.trainer import Trainer

    trainer = Trainer(cfg, resume=args.resume)
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

        def on_step(row: dict[str, Any]) -> None:
            progress.update(task, completed=row["step"], description=_progress_line(row, trainer.agents))

        rows = trainer.train(on_step)
    if rows:
        last = rows[-1]
        console.print(f"done: step {last['step']}, {_progress_line(last, trainer.agents)}")
        console.print(
            f"peak RSS {last['mem/peak_rss_mb']:.0f} MiB; metrics in {Path(cfg.log.run_dir) / 'metrics.jsonl'}"
        )
    return 0


def eval_main(argv: list[str]) -> int:
    from drmas_train.evaluation import eval_parser, run_eval

    args = eval_parser().parse_args(argv)
    _quiet_transformers()
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])
    result = run_eval(args)
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `drmas-train` and `python -m drmas_train`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "eval":
        return eval_main(argv[1:])
    return train_main(argv)
