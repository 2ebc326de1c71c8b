"""`drmas-train plan`: what a run will cost, before any GPU (data, prompt lengths, engines, memory, time).

drmas-train plan --preset math-2x-qwen3-4b
drmas-train plan --preset search-shared-qwen2.5-7b --set placement.gpu_memory_gib=139.8 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from drmas_train.cli.args import ArgParser, _assignment


def plan_parser() -> ArgParser:
    p = ArgParser(
        prog="drmas-train plan",
        description="What a run will cost before any GPU: datasets and sizes, steps per epoch, prompt lengths "
        "against the cap, engine settings, memory per pool rank against placement.gpu_memory_gib (fits or not), "
        "and an estimate of wall time and GPU-hours. Needs no GPU and no weights.",
    )
    p.add_argument("--preset", default="cpu", help="a shipped preset or a YAML file (default: cpu)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any config field")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("--offline", action="store_true", help="never contact the Hugging Face hub (models or data)")
    p.add_argument("--sample", type=int, default=128, help="tasks whose prompts are measured (default 128)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks with errors")
    return p


def parse_plan_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The flags of `drmas-train plan` and its `--set` overrides."""
    parser = plan_parser()
    args = parser.parse_args(argv)
    if args.sample < 1:
        parser.error("--sample must be >= 1")
    return args, dict(_assignment(parser, item) for item in args.set)


@contextlib.contextmanager
def hub_offline(offline: bool) -> Iterator[None]:
    """Within it, every Hugging Face hub call fails at once instead of retrying a network that is not there.

    huggingface_hub reads $HF_HUB_OFFLINE when imported, so an imported one gets its flag set too; both
    are restored afterwards.
    """
    if not offline:
        yield
        return
    old_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    old_flag = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old_env
        if constants is not None:
            constants.HF_HUB_OFFLINE = old_flag


def run_plan(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """Build the config and its plan."""
    from drmas_train.config import build_config

    cfg = build_config(args.preset, overrides)
    with hub_offline(args.offline):
        from drmas_train.plan import build_plan

        return build_plan(cfg, preset=args.preset, offline=args.offline, sample=args.sample)


def dumps(plan: dict[str, Any]) -> str:
    """The plan as JSON."""
    return json.dumps(plan, indent=2, default=str)
