"""A service an env depends on that goes down during training: one error naming it, the step and the checkpoint.

A search env asks its retrieval service on every search; the client retries a failed request a bounded
number of times (the env's `retries`), then raises `drmas_envs.ServiceError`. The trainer stops there: the
step in progress is not trained and no checkpoint is written for it, so the last complete one is intact.
`ServiceOutageError` adds what the user needs to go on: the step and that checkpoint. `drmas-train` prints
it as one line and exits with status 4; `--resume` continues once the service answers again.
"""

from __future__ import annotations

from drmas_envs import ServiceError


class ServiceOutageError(RuntimeError):
    """A service the env depends on failed during a run.

    Args:
        cause: the env's error, naming the service.
        step: the training step in progress (0: the validation before training).
        checkpoint: the last complete checkpoint's step, if the run has one.

    """

    def __init__(self, cause: ServiceError, step: int, checkpoint: int | None):
        self.url, self.step, self.checkpoint = cause.url, step, checkpoint
        when = "during the validation before training" if step == 0 else f"during step {step}"
        if checkpoint is None:
            after = "the run has no checkpoint yet, so --resume starts it again"
        else:
            after = f"the last complete checkpoint is step {checkpoint}: --resume continues once the service answers"
        super().__init__(f"{cause} ({when}; {after})")


def service_error(exc: BaseException) -> ServiceError | None:
    """The `ServiceError` that `exc` is or was raised from (a rollout thread chains it), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ServiceError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
