"""Start-up memory of a 2-rank FSDP pool loading shard by shard, against one process loading the model whole.

    .venv/bin/python -m drmas_benchmarks.shard_load_memory [--file-dtype bfloat16|float32] [--dir /tmp/x]

A random Qwen2-shaped model of at least 2 GB in fp32 (9 layers of width 2048, a 32k vocabulary, untied
head) is saved as safetensors in `--file-dtype` (bf16 as the real checkpoints are, or fp32) and loaded
in fp32, on the CPU:

- whole: one process runs the old path, `from_pretrained(dtype=fp32).to("cpu")` (`load_model`);
- shard-wise: two processes (gloo over loopback) each build the model on the meta device, shard it
  with FSDP2 and read their rows from the files (`learner.shard_load.load_sharded`).

Each process reports the peak of its anonymous memory (RssAnon, sampled every 0.5 ms: safetensors
pages are file-backed, so RSS would count the page cache of the mapped files) above its own baseline
(taken after imports and, for the ranks, the process group and the empty model), its wall time, and
for the ranks their shard's bytes and the largest decoder layer's whole bytes. The shard-wise weights
are gathered and compared with the whole load's, exactly. Results go to
benchmarks/results/shard_load_memory.{md,json} (`--out` changes the stem); a second `--file-dtype`
run merges its rows into the same files.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

GIB = 1024**3
SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=9,
    num_attention_heads=16,
    num_key_value_heads=4,
    tie_word_embeddings=False,
)


def build(folder: Path, file_dtype: str) -> Path:
    """Save the random model in `file_dtype` under `folder` (reused when already there)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, dtype=file_dtype)).to(getattr(torch, file_dtype))
    model.save_pretrained(folder)
    return folder


def whole(folder: str, out: str) -> None:
    """The old path in this process; writes {peak, baseline, seconds} to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    from drmas_train.testing.anon_memory import AnonPeak

    torch.set_num_threads(1)
    start = time.perf_counter()
    with AnonPeak() as peak:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to("cpu")
    seconds = time.perf_counter() - start
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    Path(out).write_text(json.dumps({"baseline": peak.start, "peak": peak.peak, "seconds": seconds, "bytes": params}))


def _rank(rank: int, port: int, folder: str, out_dir: str) -> None:
    import torch

    from drmas_train.engines.loading import empty_model
    from drmas_train.learner.distributed import decoder_layers, full_tensor, join
    from drmas_train.learner.shard_load import load_sharded
    from drmas_train.testing.anon_memory import AnonPeak

    torch.set_num_threads(1)
    dp = join(rank, 2, "127.0.0.1", port, timeout_s=1800, strategy="fsdp")
    module = empty_model(folder, dtype="float32")
    layer = max(sum(p.numel() * p.element_size() for p in m.parameters()) for m in decoder_layers(module))
    start = time.perf_counter()
    with AnonPeak() as peak:
        load_sharded(module, folder, dp, torch.device("cpu"))
    seconds = time.perf_counter() - start
    shard = sum(p.to_local().untyped_storage().nbytes() for p in module.parameters())
    row = {"baseline": peak.start, "peak": peak.peak, "seconds": seconds, "shard_bytes": shard, "layer_bytes": layer}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(row))
    # The check, outside the measured window: every tensor, gathered one at a time, equals the whole load's.
    ref = None
    if rank == 0:
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    state = module.state_dict()
    same = ref is None or set(ref) == set(state)
    for name, tensor in state.items():
        gathered = full_tensor(tensor)  # a collective: both ranks, same order
        if ref is not None:
            same = same and torch.equal(gathered, ref[name])
    if rank == 0:
        Path(out_dir, "equal.json").write_text(json.dumps(bool(same)))
    torch.distributed.destroy_process_group()


def shard_wise(folder: str, out_dir: str) -> tuple[list[dict], bool]:
    import torch.multiprocessing as mp

    from drmas_train.learner.distributed import rendezvous_address

    _, port = rendezvous_address()
    mp.spawn(_rank, args=(port, folder, out_dir), nprocs=2, join=True)
    ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, json.loads(Path(out_dir, "equal.json").read_text())


def run_whole(folder: str, out_dir: str) -> dict:
    """`whole` in a fresh process (so its baseline is a bare one, as the ranks' are)."""
    import subprocess
    import sys

    out = str(Path(out_dir, "whole.json"))
    code = f"from drmas_benchmarks.shard_load_memory import whole; whole({folder!r}, {out!r})"
    subprocess.run([sys.executable, "-c", code], check=True)
    return json.loads(Path(out).read_text())


def report(rows: dict[str, dict], cpu: str) -> str:
    lines = [
        "# Start-up memory: shard-wise loading on a 2-rank FSDP pool vs one whole load",
        "",
        f"CPU only ({cpu}); `.venv/bin/python -m drmas_benchmarks.shard_load_memory --file-dtype D`.",
        "A random Qwen2-shaped model (9 layers, width 2048, 32k vocabulary, untied head) loaded in fp32;",
        "the file dtype is the one it was saved in. Anonymous memory (RssAnon) above each process's",
        "baseline, peak over the load (sampled every 0.5 ms); 'bound' is the tests' rule, the rank's",
        "shard + one decoder layer. Other jobs shared the machine's cores (times are indicative).",
        "",
        "| file dtype | fp32 model | whole load: peak RssAnon, s | rank 0 / 1: peak RssAnon"
        " | bound (shard + layer) | ranks' s | weights equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for dtype, r in rows.items():
        w, ranks = r["whole"], r["ranks"]
        peaks = " / ".join(f"{(k['peak'] - k['baseline']) / GIB:.3f}" for k in ranks)
        bounds = " / ".join(f"{(k['shard_bytes'] + k['layer_bytes']) / GIB:.3f}" for k in ranks)
        secs = " / ".join(f"{k['seconds']:.1f}" for k in ranks)
        lines.append(
            f"| {dtype} | {w['bytes'] / GIB:.2f} GiB | {(w['peak'] - w['baseline']) / GIB:.3f} GiB, {w['seconds']:.1f} "
            f"| {peaks} GiB | {bounds} GiB | {secs} | {r['equal']} |"
        )
    lines += [
        "",
        "Reading the rows: from a bf16 file (as the paper's checkpoints are) the whole load converts every",
        "tensor, so the whole fp32 model is anonymous memory in each process that loads it; a rank holds",
        "its half plus one tensor's converted rows at a time. From an fp32 file the whole load holds almost",
        "no anonymous memory: transformers leaves the parameters as views of a private (copy-on-write)",
        "mapping of the file, so they are page cache until something writes them (an optimizer step copies",
        "each page it writes) or moves them (`.to(cuda)` puts the whole model on the GPU); a rank's shards",
        "are its own memory from the start, half the model here.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    from drmas_benchmarks.machine import cpu_line

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--dir", type=Path, default=None, help="where to keep the random model (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/shard_load_memory"))
    parser.add_argument("--report", action="store_true", help="only rewrite the .md from the stored .json")
    args = parser.parse_args()
    stored = args.out.with_suffix(".json")
    if args.report:
        data = json.loads(stored.read_text())
        args.out.with_suffix(".md").write_text(report(data["rows"], data["cpu"]))
        return
    with tempfile.TemporaryDirectory(prefix="drmas-shard-load-") as tmp:
        folder = str(build((args.dir or Path(tmp)) / f"qwen2-{args.file_dtype}", args.file_dtype))
        ranks, equal = shard_wise(folder, tmp)
        row = {"whole": run_whole(folder, tmp), "ranks": ranks, "equal": equal}
    data = json.loads(stored.read_text()) if stored.is_file() else {"rows": {}}
    data["cpu"] = cpu_line()
    data["shape"] = SHAPE
    data["rows"][args.file_dtype] = row
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps(data, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(data["rows"], data["cpu"]))
    print(report(data["rows"], data["cpu"]))


if __name__ == "__main__":
    main()
