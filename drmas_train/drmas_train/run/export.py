"""A checkpoint as Hugging Face model folders: one per trained model, loadable by transformers and vLLM.

`export_checkpoint` writes `<out>/<policy>/` for each policy of the checkpoint: safetensors weights in
`models.dtype`, `config.json`, the tokenizer (with its chat template) and `generation_config.json`.
The weights are the checkpoint's alone (`checkpoint.load_model_weights`: no optimizer or RNG state is
read), one model at a time. A LoRA run's policies are adapters on one base model; `lora` picks their form:

- "merged": each adapter merged into a copy of the base weights, written as a whole model;
- "adapter": a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`, naming the
  base model's folder) plus the tokenizer, for `PeftModel.from_pretrained` or vLLM's LoRA requests.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import torch

from drmas_train.config import ModelDtype, TrainConfig
from drmas_train.run.checkpoint import load_model_weights, weight_names

log = logging.getLogger(__name__)

LoraForm = Literal["merged", "adapter"]


def export_checkpoint(cfg: TrainConfig, folder: Path, out: Path, *, lora: LoraForm = "merged") -> dict[str, Path]:
    """Write one Hugging Face folder per policy of checkpoint `folder` under `out`; policy -> its folder.

    Args:
        cfg: the run's config (its `models` section says which base models the policies are).
        folder: the checkpoint folder (`<run_dir>/checkpoints/step-N`).
        out: where the folders go (created; a policy's folder already there is replaced).
        lora: a LoRA run's adapters "merged" into whole models or written as PEFT "adapter" folders.

    """
    if lora not in ("merged", "adapter"):
        raise ValueError(f"lora must be 'merged' or 'adapter', got {lora!r}")
    names = weight_names(folder)
    if not names:
        raise FileNotFoundError(f"{folder} holds no model weights")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.models.assignment == "lora":
        return _export_lora(cfg, folder, out, names, lora)
    return {name: _export_whole(cfg, folder, out, name) for name in names}


def _fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _export_whole(cfg: TrainConfig, folder: Path, out: Path, name: str) -> Path:
    """One whole model: the base model's folder loaded, the checkpoint's weights put in, saved."""
    from drmas_train.engines.assignment import load_model

    models = cfg.models
    model_name = models.name if models.assignment == "shared" else models.per_agent_names.get(name, models.name)
    model, tokenizer, _ = load_model(model_name, dtype=models.dtype, device=torch.device("cpu"))
    model.load_state_dict(load_model_weights(folder, [name])[name])
    target = _fresh(out / name)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    model.generation_config.save_pretrained(target)
    log.info("exported %s to %s", name, target)
    return target


def _export_lora(cfg: TrainConfig, folder: Path, out: Path, names: list[str], form: LoraForm) -> dict[str, Path]:
    """A LoRA run's adapters, each merged into the base model or as a PEFT adapter folder."""
    from drmas_train.engines.assignment import build_policies
    from drmas_train.learner.policy_ops import load_policy_weights

    ranks = {a: o.lora_rank for a, o in cfg.agents.items() if o.lora_rank is not None}
    models = dataclasses.replace(cfg.models, backend="transformers", device="cpu")
    policies = build_policies(models, names, seed=cfg.seed, lora_ranks=ranks)
    for name, policy in policies.items():
        load_policy_weights(policy, load_model_weights(folder, [name])[name])
    written = {}
    for name, policy in policies.items():
        target = _fresh(out / name)
        if form == "adapter":
            _save_adapter(policy.module, name, target, policy.path)
        else:
            _save_merged(policy.module, name, target, models.dtype)
            policy.module.generation_config.save_pretrained(target)
        policy.tokenizer.save_pretrained(target)
        written[name] = target
        log.info("exported %s (%s) to %s", name, form, target)
    return written


def _save_adapter(peft_model, name: str, target: Path, base: Path | None) -> None:
    """Adapter `name` as a PEFT folder whose config names the base model's folder."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        peft_model.save_pretrained(tmp, selected_adapters=[name], safe_serialization=True)
        saved = Path(tmp, name) if Path(tmp, name, "adapter_config.json").is_file() else Path(tmp)
        for f in saved.iterdir():
            if f.is_file():
                shutil.move(str(f), target / f.name)
    config = json.loads((target / "adapter_config.json").read_text())
    if base is not None:
        config["base_model_name_or_path"] = str(base)
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2))


def _save_merged(peft_model, name: str, target: Path, dtype: ModelDtype) -> None:
    """The base model with adapter `name` merged in, saved as a plain model (the others are left out)."""
    from transformers import AutoModelForCausalLM

    base = peft_model.get_base_model()
    peft_model.merge_adapter(adapter_names=[name])
    try:
        merged = {
            k.replace(".base_layer.", "."): v.detach().clone() for k, v in base.state_dict().items() if "lora_" not in k
        }
    finally:
        peft_model.unmerge_adapter()
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(base.config, dtype=getattr(torch, dtype))
    plain.load_state_dict(merged, assign=True, strict=False)
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"merging adapter {name} left parameters unset: {missing[:5]}")
    plain.tie_weights()
    plain.save_pretrained(target, safe_serialization=True)
