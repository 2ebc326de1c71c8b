"""Architecture numbers of a model: from its config.json when one is at hand, else from a table kept here.

`drmas-train plan` needs a model's shape only (no weights): parameter counts, KV-cache bytes per token
and activation sizes are arithmetic over it. Offline, the presets' models come from `KNOWN_ARCHS`,
each copied from the model's published `config.json` on the Hugging Face hub (named in `source`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Arch:
    """The shape of a decoder-only transformer (Llama, Qwen2, Qwen3 families)."""

    family: str
    """`model_type` of its config: llama, qwen2 or qwen3 (qwen2 has q/k/v biases, qwen3 q/k norms)."""
    vocab_size: int
    """Rows of the embedding (and of the LM head)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the gated MLP."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int
    """Width of one head."""
    tie_word_embeddings: bool
    """Whether the LM head is the embedding matrix (one copy of the parameters)."""
    max_position_embeddings: int
    """Longest context the model was trained for."""
    source: str = ""
    """Where the numbers come from: a config.json path, or the hub file they were copied from."""

    def hf_config_kwargs(self) -> dict[str, Any]:
        """The shape as keyword arguments of the family's transformers config (e.g. `Qwen3Config(**...)`)."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
        }

    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, gated MLP, two RMSNorms; biases and q/k norms by family)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        if self.family == "qwen2":
            attn += q + 2 * kv  # q, k, v projection biases
        if self.family == "qwen3":
            attn += 2 * self.head_dim  # per-head RMSNorms of q and k
        return attn + 3 * h * self.intermediate_size + 2 * h

    def embedding_params(self) -> int:
        """Embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def n_params(self) -> int:
        """All parameters (the final norm included)."""
        return self.num_layers * self.layer_params() + self.embedding_params() + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token takes in every layer: keys and values of each KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _qwen(**kw: Any) -> dict[str, Any]:
    return {"tie_word_embeddings": True, "head_dim": 128, **kw}


_HUB = "https://huggingface.co/{}/blob/main/config.json"

KNOWN_ARCHS: dict[str, Arch] = {
    "Qwen/Qwen3-4B": Arch(
        "qwen3",
        151936,
        2560,
        9728,
        36,
        32,
        8,
        **_qwen(max_position_embeddings=40960),
        source=_HUB.format("Qwen/Qwen3-4B"),
    ),
    "Qwen/Qwen2.5-3B-Instruct": Arch(
        "qwen2",
        151936,
        2048,
        11008,
        36,
        16,
        2,
        **_qwen(max_position_embeddings=32768),
        source=_HUB.format("Qwen/Qwen2.5-3B-Instruct"),
    ),
    "Qwen/Qwen2.5-7B-Instruct": Arch(
        "qwen2",
        152064,
        3584,
        18944,
        28,
        28,
        4,
        **_qwen(max_position_embeddings=32768, tie_word_embeddings=False),
        source=_HUB.format("Qwen/Qwen2.5-7B-Instruct"),
    ),
    "Qwen/Qwen2.5-0.5B-Instruct": Arch(
        "qwen2",
        151936,
        896,
        4864,
        24,
        14,
        2,
        **_qwen(head_dim=64, max_position_embeddings=32768),
        source=_HUB.format("Qwen/Qwen2.5-0.5B-Instruct"),
    ),
    "meta-llama/Llama-3.2-3B-Instruct": Arch(
        "llama", 128256, 3072, 8192, 28, 24, 8, 128, True, 131072, _HUB.format("meta-llama/Llama-3.2-3B-Instruct")
    ),
    "HuggingFaceTB/SmolLM2-135M-Instruct": Arch(
        "llama", 49152, 576, 1536, 30, 9, 3, 64, True, 8192, _HUB.format("HuggingFaceTB/SmolLM2-135M-Instruct")
    ),
}
"""The presets' models (and the 0.5B Qwen2.5 the memory check uses), from their published config.json."""
# The base 7B (the reference's search model) is the Instruct model's shape with a longer context.
KNOWN_ARCHS["Qwen/Qwen2.5-7B"] = replace(
    KNOWN_ARCHS["Qwen/Qwen2.5-7B-Instruct"], max_position_embeddings=131072, source=_HUB.format("Qwen/Qwen2.5-7B")
)


def arch_from_config(config: Mapping[str, Any], source: str) -> Arch:
    """An `Arch` from a Hugging Face config dict (the text of a config.json).

    Raises:
        ValueError: a field the memory model needs is missing.

    """
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return Arch(
            family=str(config.get("model_type", "llama")),
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            source=source,
        )
    except KeyError as exc:
        raise ValueError(f"{source}: config has no {exc.args[0]!r}, which the memory model needs") from None


def arch_from_folder(folder: str | Path) -> Arch:
    """The `Arch` of a local Hugging Face model folder (its config.json)."""
    path = Path(folder) / "config.json"
    return arch_from_config(json.loads(path.read_text()), str(path))


def known_arch(name: str) -> Arch | None:
    """The table's `Arch` of hub id `name` (case-insensitive), or None."""
    for key, arch in KNOWN_ARCHS.items():
        if key.lower() == name.lower():
            return replace(arch)
    return None
