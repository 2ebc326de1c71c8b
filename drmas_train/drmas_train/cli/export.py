"""`drmas-train export RUN_DIR[/checkpoints/step-N] --out DIR`: each trained model as a Hugging Face folder.

    drmas-train export runs/math --out exported/                  # the run's latest checkpoint
    drmas-train export runs/math/checkpoints/step-000100 --out exported/ --lora adapter

Writes `DIR/<policy>/` per trained model (`drmas_train.run.export`): safetensors weights in the run's
`models.dtype`, config, tokenizer and generation config, loadable by `transformers` and vLLM. Only the
checkpoint's weights are read (no optimizer or RNG state). Exit status: 0 done; 1 a missing or unreadable
checkpoint or model; 2 a usage error. Each time one line on stderr.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from drmas_train.cli.args import SETUP_ERRORS, ArgParser, report_error

console = Console(stderr=True)


def export_parser() -> ArgParser:
    """The parser of `drmas-train export`."""
    p = ArgParser(prog="drmas-train export", description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a run folder (its latest checkpoint) or <run_dir>/checkpoints/step-N")
    p.add_argument("--out", required=True, help="where to write one Hugging Face folder per trained model")
    p.add_argument(
        "--lora",
        choices=("merged", "adapter"),
        default="merged",
        help="a LoRA run's adapters: merged into whole models, or PEFT adapter folders naming the base model",
    )
    p.add_argument("--verbose", action="store_true", help="print the traceback of an error")
    return p


def export_main(argv: list[str]) -> int:
    """Entry point of `drmas-train export`; prints {policy: folder} as JSON on stdout."""
    from drmas_train.cli.eval import checkpoint_paths
    from drmas_train.config import build_config
    from drmas_train.run.export import export_checkpoint

    args = export_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])
    try:
        folder, config = checkpoint_paths(args.checkpoint)
        cfg = build_config(str(config), {})
        written = export_checkpoint(cfg, folder, Path(args.out), lora=args.lora)
    except (*SETUP_ERRORS, OSError) as exc:
        report_error(console, "error", exc, args.verbose)
        return 1
    print(json.dumps({name: str(path) for name, path in written.items()}, indent=2))
    return 0
