"""The run directory's logs: metrics.jsonl, trajectories.jsonl and TensorBoard event files.

`metrics.jsonl` has one JSON object per step (keys such as `grad_norm/<model>`, `reward/<agent>`,
`adv/<agent>/sq_mean`); `trajectories.jsonl` one object per logged episode with every call: what
the agent saw, what it said, its validity, reward and advantage, and the weight version that sampled
it. On resume, rows of steps after the checkpoint are dropped, so each step appears once.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drmas_train.algorithm.records import CallRecord
from drmas_train.rollout import RolloutBatch


def logged_episodes(group_of: Sequence[int], k: int) -> list[int]:
    """The `k` episodes of a step to log: the first of every group, then the second of every group, ...

    One episode of each task comes before a second of any, for variety; `k` above the group count still
    logs `k` episodes (up to every episode of the step).

    Args:
        group_of: each episode's group, indexed by episode.
        k: how many to return.

    """
    members: dict[int, list[int]] = {}
    for e, g in enumerate(group_of):
        members.setdefault(g, []).append(e)
    picked: list[int] = []
    for rank in range(max((len(m) for m in members.values()), default=0)):
        picked.extend(m[rank] for m in members.values() if rank < len(m))
    return picked[: max(k, 0)]


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop the rows of `path` whose step is after `last_step` (a half-written last line too)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(row.get("step", 0)) <= last_step:
            kept.append(line)
    path.write_text("".join(k + "\n" for k in kept))


class RunLog:
    """Appends metrics and trajectories to a run folder and mirrors scalars to TensorBoard.

    Args:
        run_dir: the run folder.
        resume_step: steps already done (rows after it are dropped); 0 starts fresh files.
        tensorboard: also write event files under `<run_dir>/tb`.
        wandb_project: also log to this Weights & Biases project (`log.wandb`), with `settings` as the run's
            W&B config; the run's W&B id is kept in `<run_dir>/wandb_id.txt`, so a resume continues it.
        settings: the run's whole config as plain values.

    """

    def __init__(
        self,
        run_dir: Path,
        *,
        resume_step: int = 0,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        settings: dict[str, Any] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.traj_path = self.run_dir / "trajectories.jsonl"
        for path in (self.metrics_path, self.traj_path):
            if resume_step == 0:
                path.write_text("")
            else:
                _truncate_jsonl(path, resume_step)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step + 1 if resume_step else None)
        self.wandb = None if wandb_project is None else _wandb_run(self.run_dir, wandb_project, settings or {})

    def metrics(self, row: dict[str, Any]) -> None:
        """Append one step's metrics."""
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in row.items()}
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                    self.writer.add_scalar(k, v, step)
            self.writer.flush()
        if self.wandb is not None:
            numbers = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            self.wandb.log({k: v for k, v in numbers.items() if k != "step"}, step=int(row["step"]))

    def trajectories(self, step: int, batch: RolloutBatch, episodes: Sequence[int]) -> None:
        """Append the listed episodes, every call with what the agent saw and said."""
        by_episode: dict[int, list[CallRecord]] = {}
        for r in batch.records:
            by_episode.setdefault(r.episode_id, []).append(r)
        with self.traj_path.open("a") as fh:
            for e in episodes:
                info = batch.episodes[e].info
                row = {
                    "step": step,
                    "group": batch.group_of[e],
                    "episode": e,
                    "task_index": batch.task_of[e],
                    "source": info.get("source"),
                    "team_reward": info.get("team_reward"),
                    "truncated": info.get("truncated"),
                    "calls": [_call_row(r) for r in by_episode.get(e, [])],
                }
                fh.write(json.dumps(row, default=str) + "\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _wandb_run(run_dir: Path, project: str, settings: dict[str, Any]) -> Any:
    """A W&B run logging under `run_dir/wandb`, resumed when `run_dir` has one already."""
    try:
        import wandb
    except ImportError:
        raise ImportError("log.wandb needs Weights & Biases: pip install 'drmas-train[wandb]'") from None
    id_file = run_dir / "wandb_id.txt"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
    id_file.write_text(run_id + "\n")
    return wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=settings)


def _call_row(r: CallRecord) -> dict[str, Any]:
    return {
        "turn": r.turn,
        "agent": r.agent,
        "model": r.model,
        "system": r.extra.get("system"),
        "user": r.extra.get("user"),
        "response": r.extra.get("reply_prefix", "") + r.text,  # the whole reply, as the env parsed it
        "finish": r.extra.get("finish"),
        "valid": r.valid,
        "error": r.extra.get("error", ""),
        "reward": r.reward,
        "advantage": r.advantage,
        "weight_version": r.weight_version,  # the weights that sampled it (steps they had trained)
        "prompt_tokens": len(r.prompt_ids),
        "response_tokens": len(r.response_ids),
    }
