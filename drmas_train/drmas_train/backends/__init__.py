"""Policy engines behind one seam (`base.Backend`): transformers (in-process) and vLLM."""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger(__name__)


def resolve_backend(name: str) -> str:
    """The engine a configured `models.backend` name means: "auto" picks vllm where it imports.

    vLLM generates about 2.5x the transformers backend's tokens/s on a 2-core CPU (108 vs 42.6 tok/s,
    SmolLM2 fp32, batch 32) and more on GPUs; where it is not installed the transformers backend needs
    nothing extra.
    """
    if name != "auto":
        return name
    resolved = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    log.info("backend auto -> %s%s", resolved, "" if resolved == "vllm" else " (vllm is not installed)")
    return resolved
