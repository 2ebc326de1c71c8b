"""Atomic checkpoints: written to a temporary folder, then renamed into place.

A checkpoint `<run_dir>/checkpoints/step-000012/` holds, per policy, its weights (the whole model,
or only its LoRA adapter) and its learner state (optimizer, counters) as safetensors shards with JSON
indices (`learner.shards`: under FSDP each rank writes its own shard into the one temporary folder, so
nothing is gathered whole; a run on several nodes needs that folder on a filesystem they share), plus
`index.json` (the ranks that wrote), the RNG states (python, numpy, torch: `rng.json`) and `state.json`
(step, data position), written last, once every rank has written.

Loading runs no code from the files: tensors are read by safetensors, everything else is JSON. A
checkpoint of the torch-file format written before (`weights-<name>.pt`, `learner-<name>.pt`) still
loads: its tensors with `torch.load(weights_only=True)` (tensors and plain values only; anything else is
refused), and a pickled `rng.pt` only when asked (`old_format=True`, the CLI's `--trust-checkpoint`),
and then too with numpy's RNG array as the one object allowed. `load_model_weights` is the one reader of
the weights alone (never optimizer or RNG state), for eval and export. A folder without `state.json`
(or one still named `.tmp-*`) is never read, so a run killed while saving resumes from the
previous complete checkpoint. A disk too full for the checkpoint is said before anything is written
(the tensors' size against the disk's free space), and a write that fails anyway removes its
temporary folder, so the error names the folder and the free space and the previous checkpoint stays.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from drmas_train.learner import shards

PREFIX = "step-"


UntrustedCheckpointError = shards.UntrustedCheckpointError


def rng_state() -> dict[str, Any]:
    """The python, numpy and torch RNG states, as plain JSON values."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(words), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned (or the old format's tuples and tensors, which unpack the same way)."""
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def save_checkpoint(
    root: Path,
    step: int,
    *,
    policies: dict[str, dict[str, torch.Tensor]] | None = None,
    learners: dict[str, Any] | None = None,
    state: dict,
    write: Callable[[Path], dict[str, list[int]]] | None = None,
    need: int | None = None,
) -> Path:
    """Write checkpoint `step` under `root` atomically and return its folder.

    Args:
        root: the checkpoints folder.
        step: the number of completed steps.
        policies: policy name -> tensors to save (weights or adapter), written by this process as rank 0.
        learners: policy name -> learner state dict, the same way.
        state: JSON-serialisable run state (data position, ...); `step` is added.
        write: instead of `policies` and `learners`: writes every rank's shards into the folder it is given
            (`learner.shards.write_shard`, each rank into this one shared folder) and returns, per policy,
            the ranks that wrote.
        need: the bytes `write` will write (checked against the free space first).

    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    if write is None:
        write = partial(_write_here, policies=policies or {}, learners=learners or {})
        need = tensor_bytes([policies, learners])
    free = shutil.disk_usage(root).free
    if (need or 0) > free:
        raise OSError(
            f"checkpoint step {step} needs about {need / 2**30:.2f} GiB and {root} has {free / 2**30:.2f} GiB free; "
            "nothing was written: free space (or raise log.checkpoint_every, lower log.keep_checkpoints) "
            "and rerun with --resume"
        )
    tmp.mkdir()
    try:
        shards.write_index(tmp, write(tmp))
        (tmp / "rng.json").write_text(json.dumps(rng_state()))
        # state.json last: its presence marks a complete checkpoint.
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}))
    except (OSError, RuntimeError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(
            f"writing checkpoint step {step} to {root} failed ({e}); {shutil.disk_usage(root).free / 2**30:.2f} GiB "
            "free there now; the partial checkpoint was removed and earlier ones are intact: --resume continues "
            "from the latest"
        ) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    return final


def _write_here(folder: Path, *, policies: dict[str, Any], learners: dict[str, Any]) -> dict[str, list[int]]:
    """One process's checkpoint: every tensor whole, as rank 0."""
    names = sorted({*policies, *learners})
    for name in names:
        shards.write_shard(folder, f"weights-{name}", 0, policies.get(name, {}), whole_too=True)
        shards.write_shard(folder, f"learner-{name}", 0, learners.get(name, {}), whole_too=True)
    return {name: [0] for name in names}


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


def _load_tensors(path: Path, allowed: Sequence[Any] = (), *, mmap: bool = False) -> Any:
    """A torch file of tensors and plain values (plus the `allowed` globals); anything else is refused.

    `mmap`: the tensors are views of the mapped file (read as they are used, file-backed pages).
    """
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise UntrustedCheckpointError(
            f"{path} holds more than tensors and plain values (a crafted file, or one from another program): "
            "loading it could run code, so it was not loaded"
        ) from exc


def _old_rng_globals() -> list[Any]:
    """What the old format's pickled `rng.pt` holds beside plain values: numpy's RNG state array, by the name
    numpy 1 and numpy 2 each pickle it under. Nothing else is allowed, so even this file runs no code.
    """
    multiarray = getattr(np, "_core", np).multiarray
    uint32 = type(np.dtype(np.uint32))
    names = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
    return [*((multiarray._reconstruct, name) for name in names), np.ndarray, np.dtype, uint32]


def load_model_weights(
    folder: Path, names: Sequence[str] | None = None, *, mmap: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """Each policy's weights from a checkpoint, and nothing else (no optimizer, no RNG): what eval reads.

    Args:
        folder: the checkpoint folder.
        names: the policies to read (None: every one).
        mmap: map the files instead of reading them (the tensors are read as they are used, so a
            caller converting one model at a time never holds the others).

    """
    if shards.is_sharded_checkpoint(folder):  # safetensors shards: each tensor reassembled whole
        found = {n: n for n in shards.policy_names(folder)}
        missing = set(names or ()) - set(found)
        if missing:
            raise FileNotFoundError(f"{folder} holds no weights of {sorted(missing)}")
        wanted = [n for n in found if names is None or n in names]
        return {n: _weights_from_shards(folder, n) for n in wanted}
    paths = sorted(folder.glob("weights-*.pt"))
    found = {p.stem[len("weights-") :]: p for p in paths}
    missing = set(names or ()) - set(found)
    if missing:
        raise FileNotFoundError(f"{folder} holds no weights of {sorted(missing)}")
    return {n: _load_tensors(p, mmap=mmap) for n, p in found.items() if names is None or n in names}


def _weights_from_shards(folder: Path, name: str) -> dict[str, torch.Tensor]:
    tree = shards.read_tree(folder, f"weights-{name}")
    if not isinstance(tree, dict) or not all(isinstance(t, torch.Tensor) for t in tree.values()):
        raise UntrustedCheckpointError(f"{folder}: the weights of {name} are not a mapping of names to tensors")
    return tree


is_sharded_checkpoint = shards.is_sharded_checkpoint


def weight_names(folder: Path) -> list[str]:
    """The policies a checkpoint (of either format) holds weights of."""
    if shards.is_sharded_checkpoint(folder):
        return sorted(shards.policy_names(folder))
    return sorted(p.name[len("weights-") : -len(".pt")] for p in folder.glob("weights-*.pt"))


def read_run_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's run state and RNG states alone (both JSON): {"state", "rng"}."""
    return {
        "state": json.loads((folder / "state.json").read_text()),
        "rng": json.loads((folder / "rng.json").read_text()),
    }


def load_checkpoint(folder: Path, *, old_format: bool = False) -> dict[str, Any]:
    """Read a checkpoint: {"state", "rng", "weights": {name: tensors}, "learners": {name: state}}.

    Args:
        folder: the checkpoint folder.
        old_format: also read a checkpoint of the old format, whose RNG states are a pickled `rng.pt`
            (read with numpy's RNG array as the one object allowed besides tensors and plain values).

    Raises:
        UntrustedCheckpointError: a file holds other objects (a crafted file), or the checkpoint is of the
            old format and `old_format` is off.

    """
    state = json.loads((folder / "state.json").read_text())
    if (folder / "rng.json").is_file():
        rng = json.loads((folder / "rng.json").read_text())
    elif not old_format:
        raise UntrustedCheckpointError(
            f"{folder} is a checkpoint of the old format (its RNG states are a pickle, rng.pt): it was not loaded; "
            "pass --trust-checkpoint to read it (only tensors, plain values and numpy's RNG array are accepted)"
        )
    else:
        rng = _load_tensors(folder / "rng.pt", _old_rng_globals())
    weights = load_model_weights(folder)
    if shards.is_sharded_checkpoint(folder):
        learners = {n: shards.read_tree(folder, f"learner-{n}") for n in shards.policy_names(folder)}
    else:
        learners = {p.stem[len("learner-") :]: _load_tensors(p) for p in sorted(folder.glob("learner-*.pt"))}
    return {"state": state, "rng": rng, "weights": weights, "learners": learners}
