"""Nothing a checkpoint or run folder holds runs code when it is loaded: crafted pickles and env references
are refused with one line, and the old format still loads with the flag, as safely."""

import json
import pathlib
import random

import numpy as np
import pytest
import torch
import yaml

from drmas_train.cli.main import main
from drmas_train.config import build_config
from drmas_train.run.checkpoint import (
    UntrustedCheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from drmas_train.run.trainer import Trainer


class Payload:
    """What a crafted pickle carries: unpickling it creates `marker` (a stand-in for any command)."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def _checkpoint(root: pathlib.Path) -> pathlib.Path:
    weights = {"w": torch.arange(8.0)}
    return save_checkpoint(
        root, 1, policies={"p": weights}, learners={"p": {"m": torch.ones(2), "k": (1, "a")}}, state={}
    )


def _old_checkpoint(root: pathlib.Path) -> pathlib.Path:
    """A checkpoint of the torch-file format written before the safetensors shards."""
    folder = root / "step-000001"
    folder.mkdir(parents=True)
    torch.save({"w": torch.arange(8.0)}, folder / "weights-p.pt")
    torch.save({"m": torch.ones(2), "k": (1, "a")}, folder / "learner-p.pt")
    (folder / "rng.json").write_text(json.dumps(rng_state()))
    (folder / "state.json").write_text(json.dumps({"step": 1}))
    return folder


SHARDS = ["index.json", "learner-p.rank-00000.json", "learner-p.rank-00000.safetensors"]
SHARDS += ["rng.json", "state.json", "weights-p.rank-00000.json", "weights-p.rank-00000.safetensors"]


def test_a_checkpoint_is_safetensors_and_json_and_loads_back(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    folder = _checkpoint(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == SHARDS
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt = load_checkpoint(folder)
    set_rng_state(ckpt["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert torch.equal(ckpt["weights"]["p"]["w"], torch.arange(8.0)) and ckpt["learners"]["p"]["k"] == [1, "a"]
    assert load_model_weights(folder).keys() == {"p"}


def test_a_checkpoint_of_the_torch_file_format_still_loads(tmp_path):
    folder = _old_checkpoint(tmp_path)
    ckpt = load_checkpoint(folder)
    assert torch.equal(ckpt["weights"]["p"]["w"], torch.arange(8.0)) and ckpt["learners"]["p"]["k"] == (1, "a")
    assert load_model_weights(folder).keys() == {"p"}


@pytest.mark.parametrize("file", ["weights-p.rank-00000.safetensors", "learner-p.rank-00000.safetensors"])
def test_a_crafted_shard_runs_nothing(tmp_path, file):
    folder, marker = _checkpoint(tmp_path / "ckpt"), tmp_path / "ran"
    torch.save({"w": Payload(marker)}, folder / file)  # a pickle where the safetensors file was
    with pytest.raises(UntrustedCheckpointError, match=f"{file} holds more than tensors .* was not loaded"):
        load_checkpoint(folder)
    assert not marker.exists()


def test_a_shard_index_naming_anything_but_tensors_and_plain_values_is_refused(tmp_path):
    folder = _checkpoint(tmp_path / "ckpt")
    path = folder / "learner-p.rank-00000.json"
    index = json.loads(path.read_text())
    index["tree"]["dict"]["k"] = {"object": "os.system"}
    path.write_text(json.dumps(index))
    with pytest.raises(UntrustedCheckpointError, match="learner-p.rank-00000.json holds more than tensors"):
        load_checkpoint(folder)


@pytest.mark.parametrize("file", ["weights-p.pt", "learner-p.pt"])
def test_a_crafted_tensor_file_runs_nothing(tmp_path, file):
    folder, marker = _old_checkpoint(tmp_path / "ckpt"), tmp_path / "ran"
    torch.save({"w": Payload(marker)}, folder / file)
    for old_format in (False, True):  # the flag for the old format lets no other object through
        with pytest.raises(UntrustedCheckpointError, match=f"{file} holds more than tensors .* was not loaded"):
            load_checkpoint(folder, old_format=old_format)
    assert not marker.exists()


def test_the_old_pickled_rng_file_loads_only_when_asked_and_runs_nothing_even_then(tmp_path):
    folder, marker = _old_checkpoint(tmp_path / "ckpt"), tmp_path / "ran"
    (folder / "rng.json").unlink()
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(old, folder / "rng.pt")
    with pytest.raises(UntrustedCheckpointError, match=r"old format .* pass --trust-checkpoint"):
        load_checkpoint(folder)
    set_rng_state(load_checkpoint(folder, old_format=True)["rng"])  # a genuine old checkpoint reads as before
    assert rng_state()["python"][1] == list(old["python"][1]) and rng_state()["numpy"][1] == old["numpy"][1].tolist()
    torch.save({**old, "python": Payload(marker)}, folder / "rng.pt")  # a crafted one: refused all the same
    with pytest.raises(UntrustedCheckpointError, match="rng.pt holds more than tensors"):
        load_checkpoint(folder, old_format=True)
    assert not marker.exists()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished one-step smoke run with a checkpoint."""
    run = tmp_path_factory.mktemp("safe") / "run"
    cfg = build_config("smoke", {"log.run_dir": str(run), "steps": 1, "eval.every": 0, "eval.before_train": False})
    Trainer(cfg).train()
    return run


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_resume_and_eval_refuse_a_crafted_checkpoint_in_one_line(run_dir, tmp_path, capsys):
    marker = tmp_path / "ran"
    folder = latest_checkpoint(run_dir / "checkpoints")
    torch.save({"model.embed_tokens.weight": Payload(marker)}, folder / "weights-shared.rank-00000.safetensors")
    assert main(["eval", "--checkpoint", str(run_dir), "--json"]) == 1
    assert "holds more than tensors" in _one_line_error(capsys)
    assert main(["--run-dir", str(run_dir), "--resume", "--steps", "2"]) == 1
    assert "holds more than tensors" in _one_line_error(capsys)
    assert not marker.exists()


def test_a_run_folders_env_reference_is_not_imported_unless_named_again(run_dir, tmp_path, capsys):
    marker = tmp_path / "ran"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["env"] = {"id": "os:system", "kwargs": {"command": f"touch {marker}"}, "format_penalty": None}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["eval", "--checkpoint", str(run_dir), "--json"]) == 1
    assert "env.id 'os:system' imports and runs code the file names" in _one_line_error(capsys)
    assert main(["--run-dir", str(run_dir), "--resume", "--steps", "2"]) == 2
    assert "name it again (--env os:system)" in " ".join(_one_line_error(capsys).split())
    assert not marker.exists()
