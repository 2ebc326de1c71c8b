"""The command line of `drmas-train`: flags, `--set` / dotted overrides, `--help-config`, and error exits.

Exit status: 0 done; 1 the run could not be built from its data (missing or malformed dataset, missing
model or optional package); 2 a usage or config error (unknown flag, field, env or choice, bad value or
preset), found before any model loads; 3 a Ray worker of a placed run died (the line names it, the
step and the last complete checkpoint, from which `--resume` continues). Each time one line on
stderr, no traceback (`--verbose` adds it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

import yaml
from rich.console import Console
from rich.markup import escape

from drmas_envs import DataError
from drmas_train.algorithm.advantages import ESTIMATORS
from drmas_train.config import list_presets, parse_assignment
from drmas_train.config.help import PLAIN_FLAGS, field_choices, iter_fields, render
from drmas_train.engines.extras import MissingExtraError

USAGE = (
    "%(prog)s [--preset NAME|FILE] [--env ID] [options] [--set KEY=VALUE ...] [--SECTION.FIELD VALUE ...]\n"
    "       %(prog)s eval [--checkpoint DIR | --model NAME --env ID] [options]  (see: %(prog)s eval --help)\n"
    "       %(prog)s plan [--preset NAME|FILE] [--set KEY=VALUE ...] [--json]  (see: %(prog)s plan --help)\n"
    "       %(prog)s export RUN_DIR[/checkpoints/step-N] --out DIR [--lora merged|adapter]"
)

CONFIG_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, FileNotFoundError, yaml.YAMLError)
"""What `build_config` raises on a bad preset, field or value (exit status 2)."""

SETUP_ERRORS: tuple[type[BaseException], ...] = (DataError, FileNotFoundError, MissingExtraError, ValueError)
"""What building a run raises on bad input: malformed or missing data, unknown dataset or agent, missing
model or optional package (exit 1). An unknown env (`drmas_envs.EnvNotFoundError`) is a config error (2)."""


class ArgParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: ... (see prog --help)`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpConfig(argparse.Action):
    """`--help-config [PREFIX]`: print every config field (or those under PREFIX) and exit."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        prefix = values or ""
        if not any(f.key.startswith(prefix) for f in iter_fields()):
            parser.error(f"no config field starts with {prefix!r}")
        print(render(prefix))
        parser.exit(0)


def train_parser() -> ArgParser:
    """The parser of `drmas-train` (training); `eval` has its own (`drmas_train.cli.eval.eval_parser`)."""
    p = ArgParser(
        prog="drmas-train",
        usage=USAGE,
        description="Train a team of LLM agents with agent-wise GRPO (Dr. MAS). Subcommands: eval, plan.",
        epilog=f"presets: {', '.join(list_presets())}. Any config field: --set section.field=value or "
        "--section.field value (e.g. --learner.lr 1e-5); `--help-config` lists them all with their help. "
        "Exit status: 1 a data or model error, 2 a usage, config or env error.",
    )
    p.add_argument(
        "--preset", default=None, help="a shipped preset or a YAML file (default: cpu; cpu-search for --env search-*)"
    )
    p.add_argument("--env", default=None, help="env.id: a registered env id (e.g. math-2agent) or module:factory")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    estimators = "; ".join(f"{name}: {spec.help}" for name, spec in ESTIMATORS.items())
    p.add_argument(
        "--estimator",
        default=None,
        choices=field_choices("algo.estimator"),
        help=f"advantage estimator (algo.estimator). {estimators}",
    )
    p.add_argument(
        "--assignment",
        default=None,
        choices=field_choices("models.assignment"),
        help="agents -> models (models.assignment)",
    )
    p.add_argument("--model", default=None, help="models.name: HF id, local folder, or tiny")
    p.add_argument(
        "--backend", default=None, choices=field_choices("models.backend"), help="generation engine (models.backend)"
    )
    p.add_argument(
        "--placement",
        default=None,
        choices=field_choices("placement.mode"),
        help="where the models run (placement.mode)",
    )
    p.add_argument("--ray-address", default=None, help='join this Ray cluster ("auto", "ray://head:10001")')
    p.add_argument("--run-dir", default=None, help="where logs and checkpoints go (log.run_dir)")
    p.add_argument("--seed", type=int, default=None, help="seed of data order, sampling and init")
    p.add_argument("--resume", action="store_true", help="continue from the run dir's latest checkpoint")
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="--resume from a checkpoint of the old format, whose RNG states are a pickled rng.pt (read with "
        "tensors, plain values and numpy's RNG array as the only objects allowed)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any config field")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--help-config",
        action=_HelpConfig,
        nargs="?",
        metavar="PREFIX",
        help="list every config field (or those starting with PREFIX, e.g. learner) with type, default and help",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging; tracebacks with errors")
    return p


def _assignment(parser: argparse.ArgumentParser, text: str) -> tuple[str, Any]:
    try:
        return parse_assignment(text)
    except (ValueError, yaml.YAMLError) as exc:
        parser.error(f"bad override {text!r}: {' '.join(str(exc).split())}")


def parse_train_args(argv: Sequence[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Parse plain flags, `--set k=v` and dotted flags (`--a.b v` / `--a.b=v`) into overrides."""
    parser = train_parser()
    args, rest = parser.parse_known_args(list(argv))
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "." not in tok.split("=", 1)[0]:
            parser.error(f"unrecognised argument {tok!r}")
        if "=" in tok:
            key, value = _assignment(parser, tok[2:])
        elif i + 1 < len(rest):
            key, value = _assignment(parser, f"{tok[2:]}={rest[i + 1]}")
            i += 1
        else:
            parser.error(f"{tok} needs a value")
        overrides[key] = value
        i += 1
    for item in args.set:
        key, value = _assignment(parser, item)
        overrides[key] = value
    plain = {key: getattr(args, flag[2:].replace("-", "_")) for key, flag in PLAIN_FLAGS.items()}
    overrides.update({k: v for k, v in plain.items() if v is not None})
    return args, overrides


def report_error(console: Console, kind: str, exc: BaseException, verbose: bool = False) -> None:
    """One line on stderr, `<kind>: <message>`; with `verbose` the traceback too."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    console.print(f"[red]{kind}:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    if verbose:
        console.print_exception()


def check_saved_env(env_id: str, named: str | None, source: str) -> None:
    """Refuse a `module:attr` env reference read from a run folder's config unless the command line names it.

    Building such an env imports the module the file names and calls what it names, so a shared run
    folder could run any code on `--resume` or `eval --checkpoint`; registered and installed env ids run
    only what is installed. `named`: the env id the user gave on the command line, if any.

    Raises:
        ValueError: a reference the user did not name again.

    """
    import drmas_envs

    if ":" in env_id and env_id != named and env_id not in drmas_envs.list_envs():
        raise ValueError(
            f"{source}: env.id {env_id!r} imports and runs code the file names; it is not a registered or installed "
            f"env, so it was not loaded: if you trust this run folder, name it again (--env {env_id})"
        )
