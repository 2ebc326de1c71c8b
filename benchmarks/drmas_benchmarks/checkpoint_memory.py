"""Save-time memory of a 2-rank FSDP checkpoint: each rank writing its own shard vs gathering everything whole.

    .venv/bin/python -m drmas_benchmarks.checkpoint_memory [--layers 6] [--width 2048] [--out STEM]

Two processes (gloo over loopback) shard a stack of `--layers` fp32 Linear layers of `--width` with
FSDP2 (one `fully_shard` per layer and one at the root), take one AdamW step (so the optimizer holds
its two moments), then save, in turn:

- gather (the format written before): every rank gathers the weights and the optimizer state whole
  (`distributed.full_state_dict`, `full_optimizer_state`) and rank 0 writes them with `torch.save`
  (in a placed run the driver wrote them, after Ray had carried rank 0's whole copy to it);
- sharded (`learner.shards.write_shard`): every rank writes its own local shards as safetensors.

Each process reports the peak of its anonymous memory (RssAnon, sampled every 0.5 ms) above its
baseline taken just before the save (after `malloc_trim`, so freed heap pages are not reused unseen),
and its shard's bytes (its local weights and moments). Results go to
benchmarks/results/checkpoint_memory.{md,json} (`--out` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

MIB = 1024**2
BUFFER = 32 * MIB
"""What a rank may hold above its own shard while it saves (the tests' bound): serialisation headers,
the sampler thread, allocator slack."""


def _rank(rank: int, port: int, layers: int, width: int, mode: str, out_dir: str) -> None:
    import ctypes
    import gc

    import torch
    from torch.distributed.fsdp import fully_shard

    from drmas_train.learner.distributed import full_optimizer_state, full_state_dict, join
    from drmas_train.learner.shards import write_shard
    from drmas_train.testing.anon_memory import AnonPeak

    torch.set_num_threads(1)
    join(rank, 2, "127.0.0.1", port, timeout_s=600, strategy="fsdp")
    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in module:
        fully_shard(layer)
    fully_shard(module)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module(torch.randn(2, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    local = [p.to_local() for p in module.parameters()]
    moments = [v.to_local() for s in optimizer.state.values() for v in s.values() if hasattr(v, "to_local")]
    shard = sum(t.numel() * t.element_size() for t in [*local, *moments])
    whole = sum(p.numel() * p.element_size() for p in module.parameters()) * 3
    folder = Path(out_dir, mode)
    folder.mkdir(exist_ok=True)
    # Freed heap pages go back to the system first, so the save's allocations show instead of reusing them.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    torch.distributed.barrier()
    with AnonPeak() as peak:
        if mode == "gather":
            weights, opt = full_state_dict(module), full_optimizer_state(optimizer)
            if rank == 0:
                torch.save({"weights": weights, "optimizer": opt}, folder / "checkpoint.pt")
            del weights, opt
        else:
            write_shard(folder, "weights-m", rank, module.state_dict(), whole_too=rank == 0)
            write_shard(folder, "learner-m", rank, {"optimizer": optimizer.state_dict()}, whole_too=rank == 0)
        peak.sample()
    row = {"rank": rank, "mode": mode, "baseline": peak.start, "peak": peak.peak, "shard_bytes": shard}
    row["whole_bytes"] = whole
    Path(out_dir, f"{mode}-rank{rank}.json").write_text(json.dumps(row))
    torch.distributed.destroy_process_group()


def measure(mode: str, *, layers: int, width: int, out_dir: str) -> list[dict]:
    """Both ranks' rows for `mode` ("gather" or "sharded"), each from fresh processes."""
    import torch.multiprocessing as mp

    from drmas_train.learner.distributed import rendezvous_address

    _, port = rendezvous_address()
    mp.spawn(_rank, args=(port, layers, width, mode, out_dir), nprocs=2, join=True)
    return [json.loads(Path(out_dir, f"{mode}-rank{r}.json").read_text()) for r in range(2)]


def report(rows: dict[str, list[dict]], cpu: str, load: str, layers: int, width: int) -> str:
    whole = rows["sharded"][0]["whole_bytes"]
    lines = [
        "# Save-time memory: per-rank safetensors shards vs gathering the checkpoint whole",
        "",
        f"CPU only ({cpu}); load average before the run: {load}.",
        f"`.venv/bin/python -m drmas_benchmarks.checkpoint_memory --layers {layers} --width {width}`: 2 FSDP ranks",
        f"(gloo), {layers} fp32 Linear layers of width {width} after one AdamW step: weights and two moments",
        f"{whole / MIB:.0f} MiB whole. Anonymous memory (RssAnon) above each process's baseline (taken after",
        "`malloc_trim`, so the save cannot reuse freed heap pages unseen), peak over the save (sampled every",
        f"0.5 ms); 'bound' is the tests' rule: the rank's own shard + {BUFFER // MIB} MiB.",
        "",
        "| save | rank 0 / 1: peak RssAnon growth | rank 0 / 1: own shard | bound |",
        "|---|---|---|---|",
    ]
    for mode, ranks in rows.items():
        growth = " / ".join(f"{(r['peak'] - r['baseline']) / MIB:.0f}" for r in ranks)
        shard = " / ".join(f"{r['shard_bytes'] / MIB:.0f}" for r in ranks)
        bound = " / ".join(f"{(r['shard_bytes'] + BUFFER) / MIB:.0f}" for r in ranks)
        lines.append(f"| {mode} | {growth} MiB | {shard} MiB | {bound} MiB |")
    lines += [
        "",
        "Reading the rows: gathering puts the whole checkpoint (weights and moments) into every rank's",
        "anonymous memory, and in a placed run the driver held one more whole copy to write it. A rank",
        "writing its own shard writes its CPU tensors from their own memory (safetensors makes no serialised",
        "copy of a contiguous CPU tensor); on a GPU each tensor is copied to the host first, so at most the shard.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from drmas_benchmarks.machine import cpu_line

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "checkpoint_memory"))
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        rows = {m: measure(m, layers=args.layers, width=args.width, out_dir=tmp) for m in ("gather", "sharded")}
    Path(args.out + ".json").write_text(
        json.dumps({"cpu": cpu_line(), "load": load, "layers": args.layers, "width": args.width, **rows}, indent=2)
        + "\n"
    )
    Path(args.out + ".md").write_text(report(rows, cpu_line(), load, args.layers, args.width))


if __name__ == "__main__":
    main()
