"""Bounded-staleness asynchronous training: a producer thread rolls out the next steps while the learner updates.

`rollout.max_staleness: k`. With k = 0 the trainer runs the synchronous loop (no thread). With
k >= 1 a `RolloutProducer` thread rolls out the batches of steps t + 1, ..., t + k while the main
thread trains step t (docs/training.md). The choices, each stated once:

- Versions: a weight version is the number of training steps the weights have taken. Every call
  records the version that sampled it (`CallRecord.weight_version`, also in trajectories.jsonl).
  Step t trains the weights of version t - 1; a call's staleness there is t - 1 - its version
  (`rollout/staleness_mean`, `rollout/staleness_max`).
- The bound: the producer starts the batch of step j only once the learner has finished step
  j - 1 - k, so that batch is sampled by version >= j - 1 - k (versions only grow) and no call is
  more than k versions old when it is trained on. The trainer also drops any prompt group holding a
  call older than k (`versions.drop_stale_groups`, `rollout/dropped_groups`): a safety net the bound
  keeps empty.
- Pushes (this process): after each step the main thread copies every policy's new weights into the
  engines at once, under the `WeightClock` lock, which the producer holds for a whole batch: a push
  lands between two batches, so a batch (and each request, group and episode in it) is sampled by
  one version. The engines are copies of the learners' modules (the transformers engine otherwise
  shares the trained module). The cost: a push waits for the batch in flight; with k = 1 the
  learner would wait for that batch anyway (it is the next step's), and the producer waits for that
  very push before its next batch, so with k = 1 step t >= 2 trains on a batch of version t - 2
  exactly and a run repeats itself from its seed. With k >= 2, how far the producer runs ahead
  depends on how fast generation is against the update.
- Placed runs: the producer calls the Ray workers while the main thread sends them updates. A worker
  is an actor that runs one call at a time and pushes into its engine right after its update, so a
  push lands between two requests (the worker stamps each request's version), but possibly between
  two rounds of a batch: a group can then hold calls of two versions, both within the bound. With a
  rollout pool (`placement.rollout_pool`) the engines are actors of their own that stamp each request
  and take each push between two requests, so generation runs while the learner workers update.
- Such a group is kept whole: its rewards are outcomes of whole episodes, so the per-agent advantages
  (Dr. MAS: per prompt group and agent) are computed over the step's records whatever their versions,
  exactly as in a synchronous step; versions enter only the per-token correction below.
- Off-policy correction (`learner.old_logprobs`): "decoupled" (AReaL's decoupled PPO) clips the ratio
  against a proximal policy, the learner's own weights at the start of the update (version t - 1,
  recomputed from the current weights as the synchronous "recompute" does), and weights each token by
  pi_prox / pi_behaviour, the behaviour log-prob being the engine's sampling log-prob; tokens whose
  weight exceeds `learner.behaviour_weight_cap` are left out. "sampled" is the plain form: the
  behaviour log-prob is the ratio's denominator. k >= 1 needs one of the two ("recompute" would treat
  old samples as the current policy's).
- Validation runs in the main thread between steps, after the step's push and holding the engines for
  its whole pass, so on a known version: the step's (`val/weight_version`).
- Resume: checkpoints hold trained steps only (weights, optimizer, the data position of the last
  trained batch). A run killed with batches in flight resumes at its last checkpoint and rolls those
  batches out again, from their own tasks and seeds but with the checkpoint's (newer) weights: it
  loses the in-flight rollouts, never a trained step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from drmas_train.rollout.episodes import RolloutBatch


class RolloutProducer:
    """Rolls out the batches of steps `first` .. `last` in a thread, each once the staleness bound allows it.

    Args:
        make_batch: step -> the rollout batch that step trains on (runs in the producer thread).
        first: the first step to roll out (the trainer's step + 1).
        last: the last step.
        max_staleness: k >= 0; the batch of step j starts once step j - 1 - k is trained.
        trained: steps already trained (`first - 1` on a fresh or resumed run).
        setup: run once in the thread before the first batch (e.g. torch's thread count).

    """

    def __init__(
        self,
        make_batch: Callable[[int], RolloutBatch],
        *,
        first: int,
        last: int,
        max_staleness: int,
        trained: int,
        setup: Callable[[], None] | None = None,
    ):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self._make, self._setup = make_batch, setup
        self.first, self.last, self.max_staleness = first, last, max_staleness
        self._trained = trained
        self._ready: dict[int, RolloutBatch] = {}
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._setup is not None:
                self._setup()
            for step in range(self.first, self.last + 1):
                with self._cond:
                    self._cond.wait_for(lambda s=step: self._stop or self._trained >= s - 1 - self.max_staleness)
                    if self._stop:
                        return
                batch = self._make(step)
                with self._cond:
                    self._ready[step] = batch
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the trainer's thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def get(self, step: int) -> RolloutBatch:
        """The batch of `step`, once rolled out (blocks until then).

        Raises:
            RuntimeError: the producer failed (the cause is chained) or stopped before rolling it out.

        """
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None or self._stop)
            if step in self._ready:
                return self._ready.pop(step)
            if self._error is not None:
                raise RuntimeError(f"the rollout producer failed before step {step}'s batch") from self._error
            raise RuntimeError(f"the rollout producer was stopped before step {step}'s batch")

    def trained(self, step: int) -> None:
        """Tell the producer that steps up to `step` are trained and their weights pushed."""
        with self._cond:
            self._trained = step
            self._cond.notify_all()

    def in_flight(self) -> int:
        """Batches rolled out and not yet taken."""
        with self._cond:
            return len(self._ready)

    def close(self) -> None:
        """Stop before the next batch and wait for the thread (a batch under way is finished first)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
