"""The sharded checkpoint reader: a tensor written as two ranks' row slices is read back whole, or as any slice
of another rank count's mesh, from the overlapping rows of the overlapping files only."""

import json

import pytest
import safetensors.torch
import torch

from drmas_train.learner import shards


def _two_ranks(folder, full):
    """`full` written as a 2-rank FSDP run writes it: rows cut as torch.chunk cuts, one file and index per rank."""
    for rank, (offset, part) in enumerate(zip((0, 4), full.split(4))):
        safetensors.torch.save_file({"w": part.contiguous()}, str(folder / f"weights-p.rank-{rank:05d}.safetensors"))
        entry = {"shape": list(full.shape), "dtype": "float32", "dim": 0, "offset": offset}
        index = {
            "format": shards.FORMAT,
            "rank": rank,
            "tree": {"dict": {"w": {"tensor": "w"}}},
            "tensors": {"w": entry},
        }
        (folder / f"weights-p.rank-{rank:05d}.json").write_text(json.dumps(index))


def test_row_slices_reassemble_whole_and_reshard_onto_three_ranks(tmp_path):
    full = torch.arange(21.0).reshape(7, 3)
    _two_ranks(tmp_path, full)
    assert torch.equal(shards.read_tree(tmp_path, "weights-p")["w"], full)
    ranges = [(0, 0, 3), (0, 3, 6), (0, 6, 7)]  # a 3-rank mesh: rank 1's rows span both files
    parts = [shards.read_tree(tmp_path, "weights-p", lambda key, shape, r=r: r)["w"] for r in ranges]
    assert [p.shape[0] for p in parts] == [3, 3, 1]
    assert torch.equal(torch.cat(parts), full)


def test_a_missing_slice_is_an_error_not_a_short_tensor(tmp_path):
    _two_ranks(tmp_path, torch.arange(21.0).reshape(7, 3))
    (tmp_path / "weights-p.rank-00001.json").unlink()
    with pytest.raises(shards.IncompleteCheckpointError, match="cover 4 of rows 0..7"):
        shards.read_tree(tmp_path, "weights-p")
