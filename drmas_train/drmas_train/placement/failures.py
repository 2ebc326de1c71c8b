"""A Ray worker that dies: one error naming it, and calls that fail at once instead of hanging.

A worker's process can die under a run (the OOM killer, a segfault in a kernel, a lost node, a
`kill -9`). Ray then raises its own actor errors, many lines long and naming actor ids. The driver's
proxies turn them into one `WorkerDiedError` naming the worker (its pool, rank and pid, the model and
whether it was serving as engine or learner); the trainer adds the step and the last complete
checkpoint, and `drmas-train` prints that one line and exits with status 3. `--resume` continues from
that checkpoint: checkpoints are written atomically (`drmas_train.run.checkpoint`), so a save cut short
by a dead worker leaves nothing that a resume would read.

An engine actor on the rollout pool (`placement.rollout_pool`) is named by its own pool and rank; one
that dies under a learner worker's push is reported as itself, in `push()`.

`gather` waits for the calls of several ranks and names the first whose worker died; its peers may
be left waiting in a collective (the gradient all-reduce) for it, until the trainer frees every
worker of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class WorkerDiedError(RuntimeError):
    """A Ray worker (or an engine actor beside one) died while the run needed it.

    Args:
        worker: which process: e.g. "pool 'shared' rank 1 (pid 4242)".
        role: what it was serving: "engine" (generation) or "learner" (updates, weights, optimizer state).
        model: the policy whose call failed ("" when the worker served none yet).
        call: the call that failed (`generate`, `update`, `weights`, ...).
        step: the training step in progress (0: the validation before training; None: outside the loop).
        checkpoint: the last complete checkpoint's step, if the run has one.

    """

    def __init__(
        self,
        worker: str,
        role: str,
        model: str,
        call: str,
        step: int | None = None,
        checkpoint: int | None = None,
    ):
        self.worker, self.role, self.model, self.call = worker, role, model, call
        self.step, self.checkpoint = step, checkpoint
        super().__init__(self._message())

    def __reduce__(self):  # raised inside a worker, it crosses Ray by pickle
        return (type(self), (self.worker, self.role, self.model, self.call, self.step, self.checkpoint))

    def at_step(self, step: int, checkpoint: int | None) -> WorkerDiedError:
        """The same error, told the step in progress and the last complete checkpoint."""
        return WorkerDiedError(self.worker, self.role, self.model, self.call, step, checkpoint)

    def _message(self) -> str:
        if self.step is None:
            when = ""  # outside the step loop: building the workers, loading a checkpoint
        elif self.step == 0:
            when = " during the validation before training"
        else:
            when = f" during step {self.step}"
        serving = f", the {self.role} of model {self.model!r}," if self.model else ""
        text = f"Ray worker died{when}: {self.worker}{serving} in {self.call}()"
        if self.step is None:
            return text
        if self.checkpoint is None:
            return text + "; the run has no checkpoint yet, so --resume starts it again"
        return text + f"; the last complete checkpoint is step {self.checkpoint}: continue with --resume"


def is_death(exc: BaseException) -> bool:
    """Whether a Ray error says that the process serving a call died (not that the call raised).

    A constructor that raised (a missing model file, say) is not a death: Ray's error carries that
    exception's own message, which the user needs.
    """
    from ray.exceptions import NodeDiedError, RayActorError, WorkerCrashedError

    if isinstance(exc, RayActorError):
        return not exc.actor_init_failed
    return isinstance(exc, WorkerCrashedError | NodeDiedError)


def inner_death(exc: BaseException) -> WorkerDiedError | None:
    """The `WorkerDiedError` a worker raised about an actor of its own (an engine actor), if any."""
    from ray.exceptions import RayTaskError

    cause = exc.cause if isinstance(exc, RayTaskError) else None
    return cause if isinstance(cause, WorkerDiedError) else None


def gather(refs: Sequence[Any], workers: Sequence[str], role: str, model: str, call: str) -> list[Any]:
    """`ray.get(refs)`, the i-th call served by `workers[i]`, failing at the first dead worker.

    Raises:
        WorkerDiedError: a worker (or an engine actor it calls) died before its call returned.

    """
    import ray

    where = dict(zip(refs, workers))
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except Exception as exc:
            inner = inner_death(exc)
            if inner is not None and inner.worker.startswith("pool "):  # on a pool of its own (the rollout pool)
                raise WorkerDiedError(inner.worker, inner.role, inner.model or model, inner.call) from exc
            if inner is not None:
                raise WorkerDiedError(f"{inner.worker} beside {where[ready[0]]}", inner.role, model, call) from exc
            if is_death(exc):
                raise WorkerDiedError(where[ready[0]], role, model, call) from exc
            raise
    return ray.get(list(refs))
