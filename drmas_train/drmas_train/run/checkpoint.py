"""Atomic checkpoints: written to a temporary folder, then renamed into place.

A checkpoint `<run_dir>/checkpoints/step-000012/` holds, per policy, its weights (the whole model,
or only its LoRA adapter) and its learner state (optimizer, counters), plus the RNG states
(python, numpy, torch) and `state.json` (step, data position). A folder without `state.json`
(or one still named `.tmp-*`) is never read, so a run killed while saving resumes from the
previous complete checkpoint. A disk too full for the checkpoint is said before anything is written
(the tensors' size against the disk's free space), and a write that fails anyway removes its
temporary folder, so the error names the folder and the free space and the previous checkpoint stays.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step-"


def rng_state() -> dict[str, Any]:
    """The python, numpy and torch RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path, step: int, *, policies: dict[str, dict[str, torch.Tensor]], learners: dict[str, Any], state: dict
) -> Path:
    """Write checkpoint `step` under `root` atomically and return its folder.

    Args:
        root: the checkpoints folder.
        step: the number of completed steps.
        policies: policy name -> tensors to save (weights or adapter).
        learners: policy name -> learner state dict.
        state: JSON-serialisable run state (data position, ...); `step` is added.

    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    need, free = tensor_bytes([policies, learners]), shutil.disk_usage(root).free
    if need > free:
        raise OSError(
            f"checkpoint step {step} needs about {need / 2**30:.2f} GiB and {root} has {free / 2**30:.2f} GiB free; "
            "nothing was written: free space (or raise log.checkpoint_every, lower log.keep_checkpoints) "
            "and rerun with --resume"
        )
    tmp.mkdir()
    try:
        for name, tensors in policies.items():
            torch.save({k: v.detach().cpu() for k, v in tensors.items()}, tmp / f"weights-{name}.pt")
        for name, learner_state in learners.items():
            torch.save(learner_state, tmp / f"learner-{name}.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        # state.json last: its presence marks a complete checkpoint.
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}))
    except (OSError, RuntimeError) as e:  # torch reports a short write as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(
            f"writing checkpoint step {step} to {root} failed ({e}); {shutil.disk_usage(root).free / 2**30:.2f} GiB "
            "free there now; the partial checkpoint was removed and earlier ones are intact: --resume continues "
            "from the latest"
        ) from e
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    return final


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor inside nested dicts, lists and tuples (a checkpoint's size, near enough)."""
    if isinstance(obj, torch.Tensor):
        return obj.nelement() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    """The most recent complete checkpoint, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the `keep` most recent checkpoints, and leftover temporary folders."""
    for tmp in root.glob(f".tmp-{PREFIX}*"):
        if not tmp.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(root)[: -max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """Read a checkpoint: {"state", "rng", "weights": {name: tensors}, "learners": {name: state}}."""
    state = json.loads((folder / "state.json").read_text())
    weights = {p.stem[len("weights-") :]: torch.load(p, map_location="cpu") for p in folder.glob("weights-*.pt")}
    learners = {
        p.stem[len("learner-") :]: torch.load(p, map_location="cpu", weights_only=False)
        for p in folder.glob("learner-*.pt")
    }
    rng = torch.load(folder / "rng.pt", weights_only=False)
    return {"state": state, "rng": rng, "weights": weights, "learners": learners}
