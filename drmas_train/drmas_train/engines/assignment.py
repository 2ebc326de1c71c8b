"""Agent-to-model assignment: which trainable weights, tokenizer and engine serve each agent.

A `Policy` is one set of trainable weights with its own optimizer (one learner): a whole model, or
one agent's LoRA adapter. Four assignments:

- shared: one model, policy "shared", for every agent (agents still get their own advantages);
- per_agent: a separate copy of the same model per agent, policy named after the agent;
- heterogeneous: per agent, possibly different architectures and tokenizers (`models.per_agent_names`);
- lora: one frozen base model with one LoRA adapter per agent; the adapters are the policies (named
  after their agents). They share one module and one engine, so one batch serves every agent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from drmas_train.config import BackendName, Device, ModelDtype, ModelsConfig
from drmas_train.engines import resolve_backend
from drmas_train.engines.base import Backend
from drmas_train.engines.loading import empty_model
from drmas_train.engines.resolve import resolve_model
from drmas_train.engines.settings import check_model_len, resolve_gen_dtype

log = logging.getLogger(__name__)


@dataclass
class Policy:
    """One set of trainable weights and how to generate with it.

    Attributes:
        name: the policy (model) key: CallRecord.model and the `grad_norm/<name>` metric.
        module: the torch module trained in place (shared by every LoRA policy).
        tokenizer: its tokenizer (with a chat template).
        backend: the engine that generates for it (shared by every LoRA policy).
        agents: the agents it serves.
        adapter: the LoRA adapter name, or None for a whole model.
        path: the folder the weights came from.

    """

    name: str
    module: torch.nn.Module
    tokenizer: Any
    backend: Backend
    agents: list[str]
    adapter: str | None = None
    path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def trainable(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The (name, parameter) pairs this policy's optimizer owns."""
        if self.adapter is None:
            yield from self.module.named_parameters()
            return
        for n, p in self.module.named_parameters():
            if "lora_" in n and f".{self.adapter}." in n:
                yield n, p

    def weights(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds for this policy: the whole state dict, or the adapter's tensors."""
        if self.adapter is None:
            return self.module.state_dict()
        return {n: p.detach() for n, p in self.trainable()}


def pick_device(device: Device) -> torch.device:
    """The torch device; "auto" means cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_engine(cfg: ModelsConfig, *, local: bool = True) -> None:
    """Replace "auto" in `cfg.backend` (and, for engines built here, `cfg.gen_dtype`) by this machine's choice.

    A run records the resolved values in its config.yaml, so an evaluation of its checkpoint builds the
    engine it trained with. Placed engines (`local` False) resolve the dtype on their own machines.
    """
    cfg.backend = resolve_backend(cfg.backend)
    if local:
        device_type = pick_device(cfg.device).type
        cfg.gen_dtype = resolve_gen_dtype(cfg.gen_dtype, dtype=cfg.dtype, backend=cfg.backend, device_type=device_type)


def load_tokenizer(path: str | Path) -> Any:
    """The model folder's tokenizer; one without a pad token pads with its end-of-sequence token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    name: str, *, dtype: ModelDtype, device: torch.device, empty: bool = False
) -> tuple[torch.nn.Module, Any, Path]:
    """Resolve `name` to a folder and load (model, tokenizer, folder).

    `empty`: build the model with its parameters on the meta device, unread (`loading.empty_model`), for
    a learner that shards it and then reads its own shards (`learner.shard_load`).
    """
    from transformers import AutoModelForCausalLM

    path = resolve_model(name)
    tokenizer = load_tokenizer(path)
    if tokenizer.chat_template is None:
        raise ValueError(f"model {name!r} ({path}) has no chat template; agents need one")
    if empty:
        model = empty_model(path, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    return model, tokenizer, path


def make_backend(
    kind: BackendName,
    module: torch.nn.Module,
    tokenizer: Any,
    path: Path,
    cfg: ModelsConfig,
    *,
    lora_rank: int | None = None,
) -> Backend:
    """The generation engine of one module: "transformers" (shares the module) or "vllm".

    `lora_rank` is the largest adapter rank the engine must accept (None: no LoRA). "auto" is vllm
    where it imports, else transformers (`backends.resolve_backend`). The engine settings come from
    `cfg.engine` (`models.engine`).

    Raises:
        ValueError: the model's positions cannot hold `cfg.engine.max_model_len` (checked for every
            backend, before any step runs).

    """
    kind = resolve_backend(kind)
    max_model_len = check_model_len(str(path), path, cfg.engine.max_model_len)
    if kind == "transformers":
        from drmas_train.engines.transformers_backend import TransformersBackend

        return TransformersBackend(module, tokenizer, max_batch_size=cfg.max_gen_batch)
    from drmas_train.engines.vllm_backend import LoraSlots, VLLMBackend  # vllm: auto was resolved above

    if max_model_len is None:
        raise ValueError(f"{str(path)!r} declares no max_position_embeddings: set models.engine.max_model_len")
    gen_dtype = resolve_gen_dtype(
        cfg.gen_dtype, dtype=cfg.dtype, backend=kind, device_type=pick_device(cfg.device).type
    )
    lora = None if lora_rank is None else LoraSlots(max_rank=max(lora_rank, 8))
    engine = dataclasses.replace(cfg.engine, max_model_len=max_model_len)
    return VLLMBackend(path, engine, dtype=gen_dtype or cfg.dtype, lora=lora, tokenizer=tokenizer)


def _add_lora(
    model: torch.nn.Module, agents: Sequence[str], cfg: ModelsConfig, ranks: dict[str, int]
) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    def lora_config(agent: str) -> LoraConfig:
        rank = ranks.get(agent, cfg.lora_rank)
        return LoraConfig(r=rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets), lora_dropout=0.0)

    peft_model = get_peft_model(model, lora_config(agents[0]), adapter_name=agents[0])
    for agent in agents[1:]:
        peft_model.add_adapter(agent, lora_config(agent))
    return peft_model


def build_policies(
    cfg: ModelsConfig,
    agents: Sequence[str],
    *,
    seed: int = 0,
    lora_ranks: dict[str, int] | None = None,
    empty: bool = False,
) -> dict[str, Policy]:
    """Build every policy of the assignment in `cfg` (a `ModelsConfig`) for these agents.

    Args:
        cfg: the `models` section of the training config.
        agents: the env's agents, in order.
        seed: seeds LoRA initialisation.
        lora_ranks: per-agent LoRA ranks (others get `cfg.lora_rank`).
        empty: whole models only: build them on the meta device, weights unread (`load_model`); their
            engines are the transformers wrapper until the caller starts real ones.

    Returns:
        Policies by name; every agent is served by exactly one.

    """
    device = pick_device(cfg.device)
    unknown = set(cfg.per_agent_names) - set(agents)
    if unknown:
        raise ValueError(f"models.per_agent_names names unknown agents {sorted(unknown)}; agents: {list(agents)}")
    if empty and cfg.assignment == "lora":
        raise ValueError("LoRA adapters are drawn, not read: a LoRA model cannot be built empty")
    if cfg.assignment == "shared":
        model, tok, path = load_model(cfg.name, dtype=cfg.dtype, device=device, empty=empty)
        backend = make_backend(cfg.backend, model, tok, path, cfg)
        return {"shared": Policy("shared", model, tok, backend, list(agents), path=path)}
    if cfg.assignment in ("per_agent", "heterogeneous"):
        if cfg.assignment == "heterogeneous" and len({cfg.per_agent_names.get(a, cfg.name) for a in agents}) < 2:
            log.warning("assignment=heterogeneous but every agent gets the same model; set models.per_agent_names")
        policies = {}
        for agent in agents:
            name = cfg.per_agent_names.get(agent, cfg.name)
            model, tok, path = load_model(name, dtype=cfg.dtype, device=device, empty=empty)
            backend = make_backend(cfg.backend, model, tok, path, cfg)
            policies[agent] = Policy(agent, model, tok, backend, [agent], path=path)
        return policies
    model, tok, path = load_model(cfg.name, dtype=cfg.dtype, device=device)  # lora
    torch.manual_seed(seed)
    peft_model = _add_lora(model, list(agents), cfg, lora_ranks or {})
    max_rank = max([cfg.lora_rank, *(lora_ranks or {}).values()])
    backend = make_backend(cfg.backend, peft_model, tok, path, cfg, lora_rank=max_rank)
    return {a: Policy(a, peft_model, tok, backend, [a], adapter=a, path=path) for a in agents}


def agent_to_policy(policies: dict[str, Policy]) -> dict[str, Policy]:
    """Map each agent to the policy that serves it."""
    return {agent: p for p in policies.values() for agent in p.agents}
