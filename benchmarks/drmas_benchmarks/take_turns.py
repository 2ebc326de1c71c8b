"""Time two commands on one host by running them in turns, so that both see the same host.

    python -m drmas_benchmarks.take_turns --names default,fp32 --slice 20 "make train" \
        "make train ARGS='--set learner.compute_dtype=float32'"

Both start together; only one runs at a time: each gets `--slice` seconds, then is stopped (SIGSTOP to
its process group) while the other runs (SIGCONT), until both exit. Each command's *active* time (the
seconds it was allowed to run, up to its exit) is the wall time it would have taken alone on a host
that varied as this one did over the pair, so the ratio of the two is fair where back-to-back runs are
not: on a shared VM the same run's wall time can move by more than the change being timed
(benchmarks/results/learner_precision.md, "Later: a slower host").

What it assumes: the commands keep no wall-clock deadlines (a stopped process misses them), and both fit
in memory at once. Each command's own timers (a run's `time/*` metrics) include the time it was stopped;
only the active times printed here are comparable. Prints one JSON line; `--log` keeps every slice.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass
class Turn:
    """One command's process and the seconds it has been allowed to run."""

    name: str
    proc: subprocess.Popen
    active_s: float = 0.0
    slices: int = 0
    returncode: int | None = None

    def signal(self, sig: int) -> None:
        """Send `sig` to the command's whole process group (a shell, make, the run and its children)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # the group exited between poll() and the signal
            pass


def _run_slice(turn: Turn, slice_s: float) -> None:
    """Let `turn` run for up to `slice_s` seconds, or until it exits; then stop it if it is still running."""
    start = time.monotonic()
    turn.signal(signal.SIGCONT)
    while time.monotonic() - start < slice_s and turn.proc.poll() is None:
        time.sleep(0.05)
    turn.active_s += time.monotonic() - start
    turn.slices += 1
    if turn.proc.poll() is None:
        turn.signal(signal.SIGSTOP)
    else:
        turn.returncode = turn.proc.returncode


def take_turns(names: list[str], commands: list[str], slice_s: float, log: TextIO | None = None) -> list[Turn]:
    """Run shell `commands` one at a time in slices of `slice_s` seconds until all exit.

    Args:
        names: a label per command.
        commands: shell command lines; each gets its own process group.
        slice_s: seconds a command runs before the next one's turn.
        log: where to write one JSON line per slice (None: nowhere).

    Returns:
        The turns, in the order given, each with its active seconds and exit code.

    """
    turns = []
    for i, (name, command) in enumerate(zip(names, commands, strict=True)):
        started = time.monotonic()
        turn = Turn(name, subprocess.Popen(command, shell=True, start_new_session=True))
        if i > 0:  # only the first runs; the others wait, stopped, for their turn
            turn.signal(signal.SIGSTOP)
            turn.active_s = time.monotonic() - started
        turns.append(turn)
    try:
        while any(t.returncode is None for t in turns):
            for turn in turns:
                if turn.returncode is None:
                    _run_slice(turn, slice_s)
                    if log is not None:
                        row = {"who": turn.name, "active_s": round(turn.active_s, 2), "exited": turn.returncode}
                        log.write(json.dumps(row) + "\n")
                        log.flush()
    finally:  # interrupted: leave nothing stopped behind
        for turn in turns:
            if turn.proc.poll() is None:
                turn.signal(signal.SIGCONT)
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("commands", nargs="+", help="shell command lines, two or more")
    ap.add_argument("--names", default=None, help="comma-separated labels (default: a, b, ...)")
    ap.add_argument("--slice", type=float, default=20.0, help="seconds per turn")
    ap.add_argument("--log", default=None, help="a JSON-lines file for every slice")
    args = ap.parse_args()
    names = args.names.split(",") if args.names else [chr(ord("a") + i) for i in range(len(args.commands))]
    if len(names) != len(args.commands):
        ap.error(f"{len(names)} names for {len(args.commands)} commands")
    log = open(args.log, "w") if args.log else None  # noqa: SIM115 - open for the whole run
    try:
        turns = take_turns(names, args.commands, args.slice, log)
    finally:
        if log is not None:
            log.close()
    out = {t.name: {"active_s": round(t.active_s, 1), "slices": t.slices, "rc": t.returncode} for t in turns}
    first = turns[0].active_s
    out["ratio_to_first"] = {t.name: round(t.active_s / first, 4) for t in turns[1:]}
    out["slice_s"] = args.slice
    print(json.dumps(out))


if __name__ == "__main__":
    main()
