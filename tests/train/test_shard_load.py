"""Shard-wise loading on real 2-rank gloo groups: no rank holds a whole parameter, the shards equal a whole load.

Each case spawns 2 processes joined over loopback (as tests/train/test_distributed.py). A rank builds the
model on the meta device, shards it with FSDP2 and reads its rows from the safetensors files
(`learner.shard_load`); `from_pretrained` (the whole-model path) raises in the ranks, so calling it fails.

Memory rule (the start-up test): a rank's peak RssAnon while loading is at most the baseline before it
(imports, the group, the empty model) + its shard (the bytes of its local parameters) + one decoder
layer's whole bytes (+ a fixed allocator slack). The model is ~170 MB in fp32 (3 layers of ~45 MB), saved
in bf16 (each slice is converted), with every tensor's shard smaller than a layer: a rank that loaded the
model whole, or kept each converted slice beside its shard, would break the rule by about a shard. A whole
tensor read is what the allocation guard (`LargestAllocation`) catches: no op on the loading thread may create a
tensor as large as the largest parameter.
"""

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from drmas_train.engines.loading import empty_model
from drmas_train.learner.distributed import decoder_layers, full_state_dict, join, rendezvous_address
from drmas_train.learner.shard_load import load_sharded, shard_rows
from drmas_train.testing.anon_memory import AnonPeak
from drmas_train.testing.tiny import build_tiny_model

pytestmark = pytest.mark.slow
WORLD = 2


class LargestAllocation(TorchDispatchMode):
    """The largest storage (bytes) of any plain tensor an op makes inside the block, on the host or a device.

    Storages that are maps of the safetensors files (safetensors hands out views of the mapped file,
    whose pages are the page cache's, not the process's) are not allocations and are left out.
    """

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta":
                storage = t.untyped_storage()
                if storage.nbytes() > self.largest and not _in_mapped_file(storage.data_ptr()):
                    self.largest = storage.nbytes()
        return out


def _in_mapped_file(address: int) -> bool:
    """Whether `address` lies in a mapping of a .safetensors file (/proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *_, path = line.split(maxsplit=5) if len(line.split()) == 6 else (line.split()[0], "")
        if path.endswith(".safetensors"):
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return True
    return False


def _no_whole_load(*args, **kwargs):
    raise AssertionError("a rank called the whole-model path (from_pretrained)")


def _rank_main(rank, port, folders, out_dir):
    torch.set_num_threads(1)
    dp = join(rank, WORLD, "127.0.0.1", port, timeout_s=120, strategy="fsdp")
    AutoModelForCausalLM.from_pretrained = _no_whole_load
    for i, folder in enumerate(folders):  # one after the other, in a single group
        torch.save(_load_one(folder, dp), f"{out_dir}/model{i}-rank{rank}.pt")
    torch.distributed.destroy_process_group()


def _load_one(folder, dp) -> dict:
    module = empty_model(folder, dtype="float32")
    full_shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    with AnonPeak() as peak, LargestAllocation() as alloc:
        load_sharded(module, folder, dp, torch.device("cpu"))
    locals_ = {n: p for n, p in module.named_parameters()}
    return {
        "dtensor": all(isinstance(p, DTensor) for p in locals_.values()),
        "local_rows": {n: p.to_local().shape[0] for n, p in locals_.items()},
        "full_shapes": full_shapes,
        "shard_bytes": sum(p.to_local().untyped_storage().nbytes() for p in locals_.values()),
        "layer_bytes": max(sum(full_bytes(p) for p in layer.parameters()) for layer in decoder_layers(module)),
        "largest_param_bytes": max(full_bytes(p) for p in locals_.values()),
        "largest_allocation": alloc.largest,
        "baseline": peak.start,
        "peak": peak.peak,
        "full": full_state_dict(module),
    }


def full_bytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def spawn(folders, tmp_path) -> list[list[dict]]:
    """Per folder, each rank's result of loading it shard-wise (2 ranks, every folder in one group)."""
    _, port = rendezvous_address()
    mp.spawn(_rank_main, args=(port, [str(f) for f in folders], str(tmp_path)), nprocs=WORLD, join=True)
    return [
        [torch.load(tmp_path / f"model{i}-rank{r}.pt", weights_only=False) for r in range(WORLD)]
        for i in range(len(folders))
    ]


def _check_against_whole_load(ranks, folder):
    whole = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    for rank, got in enumerate(ranks):
        assert got["dtensor"]
        for name, shape in got["full_shapes"].items():  # every rank holds exactly its rows, never all of them
            start, stop = shard_rows(shape[0], rank, WORLD)
            assert got["local_rows"][name] == stop - start < shape[0], name
        # No op made a plain tensor as large as the largest parameter (a whole read of it would).
        assert got["largest_allocation"] < got["largest_param_bytes"]
        assert set(got["full"]) == set(whole)
        assert all(torch.equal(got["full"][k], whole[k]) for k in whole), "shards differ from the whole load"


def bf16_copy(folder: Path, out: Path) -> Path:
    """The model of `folder` saved in bf16, as the real checkpoints are (loading it in fp32 converts)."""
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(out)
    return out


def test_shard_wise_load_equals_the_whole_load_and_never_holds_a_whole_parameter(tmp_path):
    # A tied head from an fp32 file, and an untied one from a bf16 file (converted slice by slice).
    tied = build_tiny_model(tmp_path / "tied", arch="qwen2", tie_word_embeddings=True, seed=1)
    untied = bf16_copy(
        build_tiny_model(tmp_path / "untied", arch="qwen2", tie_word_embeddings=False, seed=1), tmp_path / "bf16"
    )
    for folder, ranks in zip([tied, untied], spawn([tied, untied], tmp_path)):
        _check_against_whole_load(ranks, str(folder))


def test_the_allocation_guard_sees_a_whole_tensor_read(tmp_path):
    # A loader that converts a whole bf16 tensor to fp32 and keeps its half: the guard must see it.
    from safetensors import safe_open

    folder = bf16_copy(build_tiny_model(arch="qwen2", tie_word_embeddings=False, seed=1), tmp_path / "bf16")
    with safe_open(folder / "model.safetensors", framework="pt") as f, LargestAllocation() as alloc:
        whole = f.get_tensor("lm_head.weight").to(torch.float32)
        half = whole[: whole.shape[0] // 2].clone()
    assert alloc.largest >= full_bytes(whole) > full_bytes(half)


@pytest.fixture(scope="module")
def mid_model(tmp_path_factory):
    """A ~170 MB fp32 Qwen2 of random weights saved in bf16, every tensor's half smaller than one decoder layer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mid") / "model"
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


ALLOCATOR_SLACK = 24 * 2**20
"""Memory the allocators (glibc's arenas, torch's CPU caching) hold beyond live tensors, whatever the model's
size: a fixed tolerance well under the shard (~85 MB) that loading the model whole would add."""


def test_start_up_peak_anon_memory_per_rank_is_its_shard_plus_one_layer(mid_model, tmp_path):
    (ranks,) = spawn([mid_model], tmp_path)
    whole_bytes = sum(t.numel() * t.element_size() for t in ranks[0]["full"].values())
    assert whole_bytes > 100e6
    for got in ranks:
        assert got["layer_bytes"] < got["shard_bytes"] < whole_bytes
        grown = got["peak"] - got["baseline"]
        assert grown >= 0.9 * got["shard_bytes"]  # the sampler saw the shards arrive
        bound = got["baseline"] + got["shard_bytes"] + got["layer_bytes"] + ALLOCATOR_SLACK
        assert got["peak"] <= bound, (grown, got["shard_bytes"])


def _worker_main(rank, port, out_dir):
    from drmas_train.config import build_config
    from drmas_train.placement.worker import PolicyWorker

    cfg = build_config("smoke", {"models.assignment": "per_agent"})
    AutoModelForCausalLM.from_pretrained = _no_whole_load  # neither the learner nor the engines may load yet
    worker = PolicyWorker(cfg, ["solver", "verifier"], {}, 1, rank, "fsdp", WORLD)
    built = {n: {p.device.type for p in pol.module.parameters()} for n, pol in worker.policies.items()}
    before = {n: pol.backend.model is pol.module for n, pol in worker.policies.items()}  # the stand-in only
    del AutoModelForCausalLM.from_pretrained  # the class's own again: the engines load their folder
    worker.join_data_parallel("127.0.0.1", port, WORLD, 120, "fsdp")
    after = {}
    for name, pol in worker.policies.items():
        engine = dict(pol.backend.model.named_parameters())
        full = full_state_dict(pol.module)
        after[name] = {
            "learner_sharded": all(isinstance(p, DTensor) for p in pol.module.parameters()),
            "engine_own": pol.backend.model is not pol.module,
            "engine_equals_shards": all(torch.equal(engine[n], full[n]) for n in engine),
        }
    torch.save({"built": built, "before": before, "after": after}, f"{out_dir}/worker{rank}.pt")
    torch.distributed.destroy_process_group()


def test_a_placed_fsdp_worker_builds_empty_shards_then_starts_its_engines(tmp_path):
    _, port = rendezvous_address()
    mp.spawn(_worker_main, args=(port, str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"worker{rank}.pt", weights_only=False)
        assert got["built"] == {"solver": {"meta"}, "verifier": {"meta"}}
        assert all(got["before"].values())
        for name, flags in got["after"].items():
            assert flags == {"learner_sharded": True, "engine_own": True, "engine_equals_shards": True}, name
