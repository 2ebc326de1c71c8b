"""Agent-wise GRPO (Dr. MAS) for a team of LLM agents: the training loop.

Each step, in order:

1. Data: the next B tasks of a seeded permutation of the env's task list (a new permutation,
   seed + epoch, each pass), whole batches only: a pass drops its last partial batch, as the reference's
   loader does, so no batch mixes two passes; the data position is one integer, saved in checkpoints.
2. Rollout: B x n episodes run in lock-step; each round the pending calls are grouped by engine,
   one batch per model (LoRA adapters of one base share a batch). Every call is a sample, recorded
   with its exact prompt and sampled ids, its sampling temperature and its sampling log-probs
   (of softmax(logits / T): the learner scores each call at its own temperature).
3. Rewards: the team reward of the episode (1 if right, else 0), minus the agent's format penalty
   on a malformed call (paper: 0.1 math, 0.01 search).
   The env also counts its grades (`grade/errors`, `grade/over_budget`); when more than
   `max_grade_error_share` of them are errors the run stops before training the step (`run.grading`).
4. Advantages: `compute_advantages` with the configured estimator: `drmas` (per prompt group and
   agent, every call a sample: the paper), `grpo` (episode scores per prompt group: the baseline),
   `pooled` (every call a sample, no agent split: the ablation), `rloo`. Under `learner.batch_layout`
   reference each model's records are first padded with copies (`learner.layout`), which count here.
5. Updates: one PPO step per policy (a model, or an agent's LoRA adapter), one after another, each
   with its own AdamW and its own grad clip; the pre-clip grad norm of each is logged every step.
   Only the calls a policy made train it. Defaults follow the paper: clip 0.2/0.2, dual clip 3,
   token-mean loss, one epoch, no KL, no entropy bonus, lr 1e-6, weight decay 0.01, clip 1.0.
6. Sync: the engines take the new weights (`load_weights`; a no-op when the transformers engine
   shares the learner's module), and with them the step's weight version (`CallRecord.weight_version`).
   With `models.engine.sleep` an engine sleeps instead and takes the current weights when it wakes,
   before each of its generations (`drmas_train.engines.sleep`): one engine per rank awake at a time.
7. Validation (`eval`, `drmas_train.run.validation`): before step 1 and every `eval.every` steps (and
   after the last), the current weights on held-out problems through the same engines: `val/avg@k`,
   `val/pass@k`, greedy `val/avg@1` and `val/answer_acc`, `val/valid/<agent>`, Verifier approval rates.
8. Logs and checkpoint: a metrics row, a few trajectories, and (every `checkpoint_every` steps) an
   atomic checkpoint with weights, optimizer and RNG states and the data position.

With `rollout.max_staleness` k >= 1 step 2's rollout moves to a producer thread that rolls out the
next k steps while this step updates (`drmas_train.rollout.pipeline` states the choices); each step
logs `rollout/staleness_mean` and `rollout/staleness_max`, the versions its samples lag behind.

The loop reaches its models through one interface, `drmas_train.run.workers`: in this process
(`LocalWorkers`), or, with `placement.mode` shared or per_agent, in Ray workers (`PlacedWorkers`,
`drmas_train.placement`), where each worker syncs its own engine after its update and checkpoints
fetch weights and optimizer states from the workers. The step is the same code for both. A placed
worker that dies ends the run with a `WorkerDiedError` naming it, the step in progress and the last
complete checkpoint (`placement.failures`), from which `resume` continues.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import drmas_envs
from drmas_train.algorithm import advantages as adv_mod
from drmas_train.algorithm.group_stats import GroupWarnings, group_stats
from drmas_train.algorithm.records import CallRecord
from drmas_train.config import TrainConfig, data_slot, save_config, steps_for_epochs, steps_per_epoch, to_dict
from drmas_train.engines.assignment import agent_to_policy, resolve_engine
from drmas_train.learner.allocator import keep_freed_memory
from drmas_train.learner.policy_ops import seed_everything, train_records
from drmas_train.placement.failures import WorkerDiedError
from drmas_train.rollout import RolloutBatch, rollout
from drmas_train.rollout.pipeline import RolloutProducer
from drmas_train.rollout.versions import drop_stale_groups, staleness_stats
from drmas_train.run.checkpoint import (
    is_sharded_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    read_run_state,
    save_checkpoint,
    set_rng_state,
)
from drmas_train.run.grading import GradeGuard, check_references
from drmas_train.run.metrics import grade_metrics, step_metrics
from drmas_train.run.outage import ServiceOutageError, service_error
from drmas_train.run.runlog import RunLog, logged_episodes
from drmas_train.run.validation import (
    agent_sampling,
    evaluate_team,
    held_out_kwargs,
    make_eval_envs,
    metrics_row,
    prompt_options,
    team_env_kwargs,
)
from drmas_train.run.workers import LocalWorkers, PlacedWorkers, Workers

log = logging.getLogger(__name__)

__all__ = ["Trainer"]


class Trainer:
    """Builds envs, policies, learners and logs from a `TrainConfig`, and runs the step loop.

    Args:
        cfg: the resolved configuration.
        resume: continue from the latest complete checkpoint in `cfg.log.run_dir`, if any.
        trust_checkpoint: also resume from a checkpoint of the old format (a pickled rng.pt, read safely).

    With `cfg.placement.mode` other than "none" the models are built in Ray workers only (never
    loaded here); `train()` frees the workers when it ends, or call `close()`.

    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, trust_checkpoint: bool = False):
        self.cfg = cfg
        self.trust_checkpoint = trust_checkpoint
        self.run_dir = Path(cfg.log.run_dir)
        seed_everything(cfg.seed)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        if cfg.keep_freed_memory:
            keep_freed_memory()
        try:
            probe = drmas_envs.make(cfg.env.id, **cfg.env.kwargs)
        except TypeError as exc:  # a misspelt env option: one clear config error, not a traceback
            raise ValueError(f"env {cfg.env.id!r} rejected its options (env.kwargs): {exc}") from exc
        if not isinstance(probe.unwrapped, drmas_envs.WorkflowEnv):  # tasks, task order, per-call rewards
            raise TypeError(f"env {cfg.env.id!r} is a {type(probe.unwrapped).__name__}; training needs a WorkflowEnv")
        self.agents = list(probe.possible_agents)
        algo = cfg.algo  # checked before any model loads: a bad threshold fails at once
        self.group_warnings = GroupWarnings(
            algo.group_warn_share, estimator=algo.estimator, group_size=cfg.rollout.group_size
        )
        unknown = set(cfg.agents) - set(self.agents)
        if unknown:
            raise ValueError(f"agents section names unknown agents {sorted(unknown)}; env agents: {self.agents}")
        self.env_kwargs = team_env_kwargs(cfg, probe)
        # The held-out data too is found (or its absence reported) before any model loads.
        held_out = (
            drmas_envs.make(cfg.env.id, **held_out_kwargs(self.env_kwargs, cfg.eval)) if cfg.eval.enabled else None
        )
        self.data_provenance = {
            "train": drmas_envs.dataset_provenance(probe),
            "eval": drmas_envs.dataset_provenance(held_out) if held_out is not None else None,
        }
        # every reference answer the grader must parse, parsed once before any model loads (`run.grading`)
        for part, report in check_references({"train": probe, "eval": held_out}).items():
            self.data_provenance[part]["reference_check"] = report
        self.grade_guard = GradeGuard(cfg.max_grade_error_share)
        self.task_order = functools.lru_cache(maxsize=2)(probe.unwrapped.task_order)
        self.n_tasks = len(probe.unwrapped.tasks)
        steps_per_epoch(self.n_tasks, cfg.rollout.prompts_per_step)  # one batch must fit in a pass
        if cfg.epochs is not None:
            cfg.steps = steps_for_epochs(cfg.epochs, self.n_tasks, cfg.rollout.prompts_per_step)
            log.info(
                "epochs %s of %d tasks at %d a step: %d steps",
                cfg.epochs,
                self.n_tasks,
                cfg.rollout.prompts_per_step,
                cfg.steps,
            )
        self.placed = cfg.placement.mode != "none"
        self.pipelined = cfg.rollout.max_staleness > 0
        """Roll out in a producer thread (`rollout.pipeline`); at max_staleness 0 it is the synchronous loop
        run through the producer, step after step (what the test of the two's equality sets)."""
        self.producer: RolloutProducer | None = None
        self.initial_validation: dict[str, float] | None = None
        self.workers: Workers | None = None
        self.runlog: RunLog | None = None
        resolve_engine(cfg.models, local=not self.placed)  # config.yaml records the engine used
        try:
            self._build_policies()
            self.serving = agent_to_policy(self.policies)
            self.sampling = {a: agent_sampling(cfg, a) for a in self.agents}
            n_envs = cfg.rollout.prompts_per_step * cfg.rollout.group_size
            self.envs = [drmas_envs.make(cfg.env.id, **self.env_kwargs) for _ in range(n_envs)]
            self.eval_envs = make_eval_envs(cfg.env.id, self.env_kwargs, cfg.eval) if cfg.eval.enabled else []
            self.step = 0
            self.running_step = 0  # the step in progress (0: the validation before training)
            self.cursor = 0  # tasks consumed so far: the data position
            if resume:
                self._resume()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.yaml", data_provenance=self.data_provenance)
            self.runlog = RunLog(
                self.run_dir,
                resume_step=self.step,
                tensorboard=cfg.log.tensorboard,
                wandb_project=cfg.log.wandb_project if cfg.log.wandb else None,
                settings=to_dict(cfg),
            )
        except BaseException:
            self.close()
            raise

    # ---- setup helpers ---------------------------------------------------------------------------
    def _build_policies(self) -> None:
        """Policies and learners: here (placement none), or in Ray workers on their pools (`workers`)."""
        cfg = self.cfg
        lora_ranks = {a: o.lora_rank for a, o in cfg.agents.items() if o.lora_rank is not None}
        self.workers = (PlacedWorkers if self.placed else LocalWorkers)(cfg, self.agents, lora_ranks)
        self.policies, self.learners = self.workers.policies, self.workers.learners

    def close(self) -> None:
        """Stop the rollout producer, close the logs and free the Ray workers and pools of a placed run (idempotent)."""
        if self.producer is not None:
            self.producer.close()
            self.producer = None
        if self.runlog is not None:
            self.runlog.close()
        if self.workers is not None:
            self.workers.close()

    def _tasks_at(self, position: int) -> list[int]:
        """The B task indices of the batch at data position `position`: whole batches of one pass's seeded
        permutation, never two passes in one batch (`config.data_slot`).
        """
        per_step = self.cfg.rollout.prompts_per_step
        epoch, offset = data_slot(position, self.n_tasks, per_step)
        return [int(i) for i in self.task_order(self.cfg.seed + epoch)[offset : offset + per_step]]

    def _rollout(self, step: int, position: int) -> RolloutBatch:
        """Step `step`'s batch: the tasks at data position `position`, sampled at the step's seed."""
        cfg = self.cfg
        with self.workers.hold():  # no weight push lands inside the batch
            return rollout(
                self.envs,
                self._tasks_at(position),
                cfg.rollout.group_size,
                self.serving,
                self.sampling,
                seed=cfg.seed * 100_003 + step - 1,
                **prompt_options(cfg, self.agents),  # validation builds its prompts the same way
            )

    def _start_producer(self) -> None:
        """Roll out the remaining steps' batches in a thread, `rollout.max_staleness` steps ahead at most."""
        step0, cursor0, per_step = self.step, self.cursor, self.cfg.rollout.prompts_per_step
        threads = self.cfg.threads

        def setup() -> None:
            if threads > 0:
                torch.set_num_threads(threads)

        self.producer = RolloutProducer(
            lambda step: self._rollout(step, cursor0 + (step - step0 - 1) * per_step),
            first=step0 + 1,
            last=self.cfg.steps,
            max_staleness=self.cfg.rollout.max_staleness,
            trained=step0,
            setup=setup,
        )

    # ---- checkpoints -----------------------------------------------------------------------------
    def save(self) -> Path:
        root = self.run_dir / "checkpoints"
        folder = save_checkpoint(
            root,
            self.step,
            write=self.workers.save_shards,
            need=self.workers.checkpoint_bytes(),
            state={"cursor": self.cursor},
        )
        prune_checkpoints(root, self.cfg.log.keep_checkpoints)
        return folder

    def _resume(self) -> None:
        folder = latest_checkpoint(self.run_dir / "checkpoints")
        if folder is None:
            log.warning("--resume: no checkpoint in %s; starting from step 0", self.run_dir)
            return
        if is_sharded_checkpoint(folder):  # each rank reads its own part
            ckpt = read_run_state(folder)
            for name in self.policies:
                self.workers.load_shards(name, folder)
        else:
            ckpt = load_checkpoint(folder, old_format=self.trust_checkpoint)
            for name in self.policies:
                self.workers.load(name, ckpt["weights"][name], ckpt["learners"][name])
        set_rng_state(ckpt["rng"])
        self.step = int(ckpt["state"]["step"])
        self.workers.set_version(self.step)
        self.cursor = int(ckpt["state"]["cursor"])
        log.info("resumed from %s (step %d)", folder, self.step)

    # ---- the step --------------------------------------------------------------------------------
    def next_batch(self) -> RolloutBatch:
        """The batch the next step would train on, rolled out with the current weights at that step's seed.

        Nothing is trained and neither the step nor the data position moves: for benchmarks and for
        looking at what the policies produce.
        """
        return self._rollout(self.step + 1, self.cursor)

    def train_step(self) -> dict[str, Any]:
        """One step: rollout, rewards, advantages, an update of each policy, sync, logs, checkpoint."""
        cfg = self.cfg
        self.running_step = self.step + 1
        t0, cpu0 = time.perf_counter(), time.process_time()
        if self.producer is not None:  # rolled out in the producer thread: wait for it if it is not done
            batch = self.producer.get(self.step + 1)
        else:
            batch = self._rollout(self.step + 1, self.cursor)
        self.cursor += cfg.rollout.prompts_per_step
        t_rollout = time.perf_counter() - t0
        stale = self._check_staleness(batch)
        # a step whose grades are too often errors is not trained (`run.grading`)
        self.grade_guard.check(self.step + 1, batch.episodes, grade_metrics(batch.episodes), self.last_checkpoint)
        # With learner.batch_layout reference, each model's records padded with copies before advantages.
        records = train_records(cfg, batch.records, self.policies, self.learners, self.step + 1)
        adv_stats = self._advantages(batch, records)
        t_adv = time.perf_counter() - t0 - t_rollout
        updates: dict[str, dict[str, float]] = {}
        t1, t_sync = time.perf_counter(), 0.0
        for name in self.learners:  # models one after another; each engine synced after its update
            updates[name] = self.workers.update(name, [r for r in records if r.model == name])
            t_sync += self.workers.sync_seconds
        self.step += 1
        self.workers.publish(self.step)  # with overlap: the push of every engine, between two batches
        t_sync += self.workers.sync_seconds
        if self.producer is not None:
            self.producer.trained(self.step)
        t_update = time.perf_counter() - t1
        t2 = time.perf_counter()
        row = step_metrics(self.step, batch, updates, self.agents)
        row.update(adv_stats)
        row.update(stale)
        row.update({"time/rollout": t_rollout, "time/update": t_update, "data/cursor": self.cursor})
        # The parts of a step that are neither generate nor update (benchmarks/drmas_benchmarks/step_efficiency.py).
        row.update({"time/prompts": batch.prompt_seconds, "time/advantages": t_adv, "time/sync": t_sync})
        row["time/metrics"] = time.perf_counter() - t2
        row["time/step"] = time.perf_counter() - t0
        # CPU seconds of this process: on a shared machine, wall time alone overstates the cost.
        row["time/step_cpu"] = time.process_time() - cpu0
        for message in self.group_warnings.check(row, self.agents):
            log.warning(message)
        if cfg.eval.due(self.step, cfg.steps):
            row.update(self.validate())  # after time/step: a step's time is training only
        row.update(self.workers.memory())  # each process's peaks over this step (validation included)
        self.runlog.metrics(row)
        self.runlog.trajectories(self.step, batch, logged_episodes(batch.group_of, self.cfg.log.trajectories_per_step))
        every = cfg.log.checkpoint_every
        if (every > 0 and self.step % every == 0) or self.step == cfg.steps:
            self.save()
        return row

    def _check_staleness(self, batch: RolloutBatch) -> dict[str, float]:
        """Drop prompt groups with a call over `rollout.max_staleness` versions old; the step's staleness metrics."""
        k = self.cfg.rollout.max_staleness
        kept = drop_stale_groups(batch.records, self.step, k)
        out = staleness_stats(kept, self.step)
        if len(kept) < len(batch.records):  # the producer's bound should make this impossible
            dropped = len({r.group_id for r in batch.records}) - len({r.group_id for r in kept})
            log.warning("step %d: dropped %d prompt groups sampled over %d versions ago", self.step + 1, dropped, k)
            out["rollout/dropped_groups"] = float(dropped)
            batch.records = kept
        return out

    def _advantages(self, batch: RolloutBatch, records: list[CallRecord] | None = None) -> dict[str, float]:
        """Fill the advantages of `records` (default: the batch's); return the step's advantage metrics."""
        recs = batch.records if records is None else records
        if not recs:
            return {}
        ids = dict(
            group_ids=np.array([r.group_id for r in recs]),
            agent_ids=np.array([r.agent for r in recs]),
            episode_ids=np.array([r.episode_id for r in recs]),
        )
        rewards = np.array([r.reward for r in recs], dtype=np.float64)
        algo = self.cfg.algo
        adv = adv_mod.compute_advantages(rewards, **ids, estimator=algo.estimator, norm_by_std=algo.norm_by_std)
        out: dict[str, float] = {}
        if algo.balance_strata:
            weights = adv_mod.strata_weights(ids["agent_ids"], [r.stratum for r in recs])
            adv = adv * weights
            for r, w in zip(recs, weights):
                if r.stratum is not None:
                    out[f"balance/{r.agent}/{r.stratum}"] = float(w)
        for r, a in zip(recs, adv):
            r.advantage = float(a)
        out.update(group_stats(rewards, **ids, estimator=algo.estimator))
        stats_fn = getattr(adv_mod, "advantage_stats", None)
        if stats_fn is not None:
            out.update(stats_fn(rewards, **ids, estimator=algo.estimator, norm_by_std=algo.norm_by_std, advantages=adv))
        return out

    def validate(self) -> dict[str, float]:
        """The `val/*` metrics of the current weights on the held-out problems, and `time/validate`."""
        t0 = time.perf_counter()
        with self.workers.hold():  # one known weight version for the whole pass (the producer waits)
            result = evaluate_team(
                self.eval_envs, self.serving, self.sampling, self.cfg.eval, **prompt_options(self.cfg, self.agents)
            )
        if result["weight_versions"] not in ([], [self.step]):
            raise RuntimeError(f"validation at step {self.step} ran on weight versions {result['weight_versions']}")
        row = metrics_row(result)
        row["time/validate"] = time.perf_counter() - t0
        log.debug("validation at step %d: %s", self.step, _brief(row))
        return row

    def train(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run until `cfg.steps` steps are done; return this call's metric rows (training steps).

        With `eval.before_train`, a fresh run first validates the initial weights: that row (step 0,
        `val/*` keys only) goes to metrics.jsonl and `self.initial_validation`.

        The rollout producer is stopped, the logs closed and a placed run's workers freed at the end,
        also on an exception.

        Raises:
            WorkerDiedError: a placed run's worker died; it names the worker, this step and the last
                complete checkpoint.
            ServiceOutageError: a service the env depends on stayed down after its retries; it names the
                service, this step and the last complete checkpoint.
            GradingError: more than `max_grade_error_share` of a step's grades were errors; it names the
                step, the failing references and the last complete checkpoint.

        """
        rows = []
        try:
            self.running_step = self.step
            if self.cfg.eval.before_train and self.step == 0:
                self.initial_validation = {"step": 0, **self.validate()}
                self.runlog.metrics(self.initial_validation)
            if self.pipelined and self.step < self.cfg.steps:
                self._start_producer()
            while self.step < self.cfg.steps:
                row = self.train_step()
                rows.append(row)
                if on_step is not None:
                    on_step(row)
        except WorkerDiedError as exc:
            raise exc.at_step(self.running_step, self.last_checkpoint()) from exc
        except RuntimeError as exc:  # the env's service (retrieval) down: the step is not trained
            cause = service_error(exc)
            if cause is None:
                raise
            raise ServiceOutageError(cause, self.running_step, self.last_checkpoint()) from exc
        finally:
            self.close()
        return rows

    def last_checkpoint(self) -> int | None:
        """The step of the latest complete checkpoint in the run folder, if any."""
        folder = latest_checkpoint(self.run_dir / "checkpoints")
        return None if folder is None else int(json.loads((folder / "state.json").read_text())["step"])


def _brief(row: dict[str, float]) -> str:
    keys = [k for k in row if k.startswith("val/") and "/valid/" not in k and k.count("/") == 1]
    return ", ".join(f"{k[4:]} {row[k]:.3f}" for k in keys)
