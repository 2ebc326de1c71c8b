"""The `drmas-train` command: `main` (training, and the `eval` subcommand), its flags (`args`), `eval`."""

from drmas_train.cli.args import parse_train_args
from drmas_train.cli.main import main

__all__ = ["main", "parse_train_args"]
