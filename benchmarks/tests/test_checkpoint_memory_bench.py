"""Save-time memory of a 2-rank FSDP checkpoint (drmas_benchmarks.checkpoint_memory, smaller): a rank writing its
own shard grows its anonymous memory by at most that shard plus the stated buffer; gathering breaks the bound."""

import pytest

from drmas_benchmarks.checkpoint_memory import BUFFER, measure

pytestmark = pytest.mark.slow


def test_each_rank_saves_within_its_own_shard_plus_the_buffer_and_gathering_does_not(tmp_path):
    rows = {m: measure(m, layers=4, width=2048, out_dir=str(tmp_path)) for m in ("sharded", "gather")}
    for r in rows["sharded"]:
        assert r["peak"] - r["baseline"] <= r["shard_bytes"] + BUFFER, r
        assert r["shard_bytes"] < r["whole_bytes"] * 0.6  # half the model and moments, give or take the biases
    # The rule tells the formats apart: every gathering rank held the whole checkpoint.
    assert all(r["peak"] - r["baseline"] > r["shard_bytes"] + BUFFER for r in rows["gather"]), rows["gather"]
    written = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert written == [
        f"{k}-m.rank-{r:05d}.{e}" for k in ("learner", "weights") for r in (0, 1) for e in ("json", "safetensors")
    ]
