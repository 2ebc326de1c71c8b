"""Grading failures never pass as wrong answers: reported at start, warned about, and above a share, the end of the run.

The env counts the outcome of each grade (right, wrong, over_budget, error: `drmas_envs.math.grading`) in its
final infos (`grades`, and `grade_errors` naming each failing reference); `run.metrics` sums them into
`grade/checks`, `grade/errors` and `grade/over_budget`. `GradeGuard` reads the same facts each step: it warns,
naming the failing references it has not named before, and stops the run with `GradingError` when more than
`max_grade_error_share` of the step's grades are errors. Over-budget grades are the policy's answers running
past the grader's bounds and never stop a run. The step is not trained and no checkpoint is written for it,
so the last complete one is intact. At start, `check_references` parses every distinct reference answer of
the train and validation data that the fast path cannot settle, warns about those that fail, and returns
what the run records in its provenance (config.yaml's `data_provenance`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import drmas_envs
from drmas_envs import EpisodeResult

log = logging.getLogger(__name__)

NAMED = 3
"""How many failing references one warning names."""


class GradingError(RuntimeError):
    """Too large a share of a step's grades were errors: the grader cannot be trusted with this data."""

    def __init__(self, step: int, errors: int, checks: int, share: float, examples: str, checkpoint: int | None):
        self.step, self.errors, self.checks, self.checkpoint = step, errors, checks, checkpoint
        if checkpoint is None:
            after = "the run has no checkpoint yet"
        else:
            after = f"the last complete checkpoint is step {checkpoint}: continue with --resume once grading works"
        super().__init__(
            f"grading failed in step {step}: {errors} of {checks} grades were errors, over "
            f"max_grade_error_share {share:g} ({examples}); {after}"
        )


def _describe(failures: Sequence[dict[str, str]]) -> str:
    named = "; ".join(f"{f['reference'][:80]!r}: {f['reason'] or 'error'}" for f in failures[:NAMED])
    more = len(failures) - NAMED
    return named + (f"; and {more} more" if more > 0 else "")


def step_failures(results: Sequence[EpisodeResult]) -> list[dict[str, str]]:
    """The distinct references whose grades were errors in a step, first seen first, with why."""
    out: dict[str, str] = {}
    for res in results:
        for failure in res.info.get("grade_errors") or ():
            out.setdefault(str(failure.get("reference")), str(failure.get("reason", "")))
    return [{"reference": r, "reason": why} for r, why in out.items()]


class GradeGuard:
    """Per step: warn naming new failing references; raise `GradingError` above the error share.

    Args:
        max_share: the largest share of a step's grades that may be errors (`max_grade_error_share`).

    """

    def __init__(self, max_share: float):
        self.max_share = float(max_share)
        self.warned: set[str] = set()

    def check(
        self,
        step: int,
        results: Sequence[EpisodeResult],
        row: dict[str, Any],
        checkpoint: Callable[[], int | None],
    ) -> None:
        """Look at one step's grades (`row`'s `grade/*`, the episodes' `grade_errors`); `checkpoint` gives the
        step of the last complete checkpoint, for the error.

        Raises:
            GradingError: more than `max_share` of the step's grades were errors.

        """
        errors, checks = int(row.get("grade/errors", 0)), int(row.get("grade/checks", 0))
        if not errors:
            return
        failures = step_failures(results)
        new = [f for f in failures if f["reference"] not in self.warned]
        if new:
            self.warned.update(f["reference"] for f in new)
            log.warning(
                "step %d: %d of %d grades were errors (grade/errors); failing reference answers: %s",
                step,
                errors,
                checks,
                _describe(new),
            )
        if checks and errors / checks > self.max_share:
            raise GradingError(step, errors, checks, self.max_share, _describe(failures), checkpoint())


def check_references(envs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each env's reference check (`drmas_envs.reference_check`), keyed like `envs` (train, eval), with a warning
    naming the first references that fail; envs that cannot check are left out.
    """
    out = {}
    for part, env in envs.items():
        report = drmas_envs.reference_check(env) if env is not None else None
        if report is None:
            continue
        out[part] = report
        if report["failed"]:
            log.warning(
                "%s data: the grader cannot parse %d of the %d distinct reference answers it may be asked about; "
                "grades against them are errors (grade/errors): %s",
                part,
                report["failed"],
                report["checked"],
                _describe(report["failures"]),
            )
    return out
