"""Generation engines and the models behind them: the engine seam (`base.Backend`), transformers (in-process)
and vLLM backends, resolving model names to local folders, and which agent uses which model (`assignment`).
"""

from __future__ import annotations

import importlib.util
import logging

from drmas_train.config import BackendName

log = logging.getLogger(__name__)


def resolve_backend(name: BackendName) -> BackendName:
    """The engine a configured `models.backend` name means: "auto" picks vllm where it imports.

    vLLM generates several times the transformers backend's tokens/s on a CPU
    (benchmarks/results/rollout_throughput.md) and more on GPUs; where it is not installed the transformers
    backend needs nothing extra.
    """
    if name != "auto":
        return name
    resolved = "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"
    log.info("backend auto -> %s%s", resolved, "" if resolved == "vllm" else " (vllm is not installed)")
    return resolved
