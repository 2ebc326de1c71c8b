"""Per-rank memory of a run: which models and engines each pool rank holds, and whether they fit.

A rank holds the training state of every model on its pool (sharded over the pool's ranks under
FSDP), the transient memory of the one model training at a time (models update one after another;
gradients are freed after each step), and an engine per model where it generates (every rank, or
rank 0 only: `placement.rollout_ranks`), or no engine where a rollout pool (`placement.rollout_pool`)
holds every model's engine: its ranks are reported apart, engines only. On a GPU a vLLM engine takes
`gpu_memory_utilization` of it (weights, then KV cache); on a CPU a vLLM engine takes its weights and
`kv_cache_gib` (1 GiB by default), and the transformers backend generates with the learner's own model
and a per-batch cache (on a rollout pool: with its own copy of the model).
The GPU parts (vLLM's budget and KV cache, FSDP sharding, CUDA context) are projections: no GPU has
checked them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drmas_train.config import BackendName, ModelDtype, TrainConfig
from drmas_train.config.placement import PoolSize
from drmas_train.plan.arch import Arch
from drmas_train.plan.memory import GIB, TrainState, dtype_bytes, lora_params, train_state

ROLLOUT_POOL = "rollout"
"""The rollout pool's name in the plan (as `drmas_train.placement.ROLLOUT_POOL`, which imports Ray's side)."""

ENGINE_OVERHEAD_GIB = 2.0
"""vLLM's own activations, sampler buffers and CUDA graphs inside its budget: an assumption (not measured)."""
CUDA_CONTEXT_GIB = 0.5
"""A training process's CUDA context and allocator slack: an assumption (not measured)."""
CPU_KV_GIB = 1.0
ENGINE_ASLEEP_GIB = 1.0
"""What a sleeping vLLM engine keeps on its GPU (sleep level 2 releases its weights and KV cache; its CUDA
graphs and allocator pool stay): an assumption (not measured)."""
"""vLLM's KV cache on a CPU when `models.engine.kv_cache_gib` is unset (`drmas_train.config.engine`)."""


@dataclass
class ModelPlan:
    """One trained model: its worker key, name, the agents it serves and its shape."""

    key: str
    name: str
    agents: list[str]
    arch: Arch | None
    adapters: int = 0
    """LoRA adapters on it (assignment lora); 0: the whole model trains."""


@dataclass
class PoolPlan:
    """One pool of ranks and the models on it."""

    name: str
    size: PoolSize
    models: list[ModelPlan]


def model_plans(cfg: TrainConfig, agents: list[str], archs: dict[str, Arch | None]) -> list[ModelPlan]:
    """The models a config trains, by `models.assignment` (one per agent, one shared, or one base with adapters)."""
    m = cfg.models
    if m.assignment == "shared":
        return [ModelPlan("shared", m.name, list(agents), archs.get(m.name))]
    if m.assignment == "lora":
        return [ModelPlan("lora", m.name, list(agents), archs.get(m.name), adapters=len(agents))]
    names = {a: m.per_agent_names.get(a, m.name) if m.assignment == "heterogeneous" else m.name for a in agents}
    return [ModelPlan(a, names[a], [a], archs.get(names[a])) for a in agents]


def pool_plans(cfg: TrainConfig, models: list[ModelPlan], gpu: bool) -> list[PoolPlan]:
    """The pools of `placement.mode`: this process, one shared pool, or one pool per worker."""
    p = cfg.placement
    if p.mode == "none":
        return [PoolPlan("process", PoolSize(cpus=1, gpus=1.0 if gpu else 0.0), models)]
    if p.mode == "shared":
        return [PoolPlan("shared", p.shared_pool, models)]
    return [PoolPlan(mp.key, p.pools.get(mp.key, p.default_pool), [mp]) for mp in models]


@dataclass
class EnginePlan:
    """One model's generation engine on one rank."""

    model: str
    backend: BackendName
    dtype: ModelDtype
    max_model_len: int
    gpu_memory_utilization: float | None
    memory: int
    """Bytes the engine holds on the rank (vLLM on a GPU: its whole budget)."""
    kv_cache: int
    """Bytes of KV cache inside that."""
    kv_tokens: int
    """Tokens the KV cache holds."""
    problem: str | None = None
    """Why the engine cannot start (budget below its weights, or a cache shorter than one sequence)."""


def engine_plan(
    cfg: TrainConfig, mp: ModelPlan, backend: BackendName, gen_dtype: ModelDtype, gpu: bool, gpu_bytes: float
) -> EnginePlan:
    """The memory of `mp`'s engine on a rank (module docstring)."""
    e, arch = cfg.models.engine, mp.arch
    assert arch is not None
    length = int(e.max_model_len or 0)
    gen_b = dtype_bytes(gen_dtype)
    kv_token = arch.kv_bytes_per_token(gen_b) // e.tensor_parallel_size
    weights = arch.n_params() * gen_b // e.tensor_parallel_size
    util = e.gpu_memory_utilization if gpu and backend == "vllm" else None
    if backend != "vllm":  # the transformers backend generates with the learner's model: only its cache is extra
        kv_token = arch.kv_bytes_per_token(dtype_bytes(cfg.models.dtype))
        kv = cfg.models.max_gen_batch * length * kv_token
        return EnginePlan(mp.key, backend, cfg.models.dtype, length, None, kv, kv, kv // max(kv_token, 1))
    if gpu and e.kv_cache_gib is None:
        memory = int(e.gpu_memory_utilization * gpu_bytes)
        kv = memory - weights - int(ENGINE_OVERHEAD_GIB * GIB)
    else:
        kv = int((e.kv_cache_gib or CPU_KV_GIB) * GIB)
        memory = weights + kv + (int(ENGINE_OVERHEAD_GIB * GIB) if gpu else 0)
    tokens = max(kv, 0) // max(kv_token, 1)
    problem = None
    if kv <= 0:
        problem = (
            f"its budget ({memory / GIB:.1f} GiB) does not hold its weights ({weights / GIB:.1f} GiB) and overhead"
        )
    elif tokens < length:
        problem = f"its KV cache holds {tokens} tokens, less than one {length}-token sequence (max_model_len)"
    return EnginePlan(mp.key, "vllm", gen_dtype, length, util, memory, max(kv, 0), tokens, problem)


@dataclass
class RankMemory:
    """What one rank (or a group of identical ranks) of a pool holds, in bytes."""

    pool: str
    ranks: str
    """e.g. "0" or "1-3"."""
    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    logits: int = 0
    fsdp_gather: int = 0
    engines: int = 0
    kv_cache: int = 0
    """Inside `engines`."""
    runtime: int = 0
    capacity: int = 0
    total_typical: int | None = None
    """The total at the measured prompt lengths (set by the caller); None without measured prompts."""
    engine_plans: list[EnginePlan] = field(default_factory=list)
    optimizer_offloaded: bool = False
    """AdamW's state lives on the host outside updates (`learner.optimizer_offload`)."""
    optimizer_training: int = 0
    """The largest model's optimizer state: all that is on the device during an update under offload (each
    model's state moves in for its own update and out after it)."""
    sleeping: bool = False
    """Engines sleep between generations (`models.engine.sleep`): one awake at a time, none in updates."""
    engine_asleep: int = 0
    """What one sleeping engine keeps on the rank (`ENGINE_ASLEEP_GIB`)."""
    startup: int = 0
    """The start-up peak: on an FSDP pool each model's shard plus one whole layer being read (models are
    built on the meta device and loaded shard by shard), elsewhere every model of the pool whole in
    `models.dtype`; its engines (built one at a time and put to sleep when they sleep) and the runtime."""
    host_startup: int = 0
    """Host memory at start-up beyond file-backed pages: one layer being read (FSDP), else the largest model
    whole (each is loaded on the host, then moved)."""

    @property
    def engines_rollout(self) -> int:
        """Engines while generating: all resident, or one awake and the others asleep."""
        if not self.sleeping or not self.engine_plans:
            return self.engines
        return max(e.memory for e in self.engine_plans) + (len(self.engine_plans) - 1) * self.engine_asleep

    @property
    def engines_update(self) -> int:
        """Engines while a model trains: all resident, or all asleep."""
        return len(self.engine_plans) * self.engine_asleep if self.sleeping else self.engines

    @property
    def rollout_phase(self) -> int:
        """Generating: the engines, the weights, and the optimizer state unless it is offloaded (no gradients:
        they are freed after each update, no activations).
        """
        optimizer = 0 if self.optimizer_offloaded else self.optimizer
        return self.weights + optimizer + self.engines_rollout + self.runtime

    @property
    def update_phase(self) -> int:
        """Training one model: its gradients, activations, logits and FSDP gathers beside the weights, the
        optimizer state (every model's, or only the training model's when offloaded) and the engines
        (resident, or asleep).
        """
        optimizer = self.optimizer_training if self.optimizer_offloaded else self.optimizer
        parts = (self.weights, self.gradients, optimizer, self.activations, self.logits, self.fsdp_gather)
        return sum(parts) + self.engines_update + self.runtime

    @property
    def total(self) -> int:
        """The steady peak: the larger phase (the start-up peak is reported apart)."""
        return max(self.rollout_phase, self.update_phase)

    @property
    def host_steady(self) -> int:
        """Host memory between updates: the offloaded optimizer state."""
        return self.optimizer if self.optimizer_offloaded else 0

    @property
    def problems(self) -> list[str]:
        out = [f"engine {e.model}: {e.problem}" for e in self.engine_plans if e.problem]
        if self.total > self.capacity:
            out.append(f"needs {self.total / GIB:.1f} GiB of {self.capacity / GIB:.1f} GiB")
        return out

    def as_dict(self) -> dict[str, Any]:
        gib = {
            k: round(getattr(self, k) / GIB, 3)
            for k in (
                "weights",
                "gradients",
                "optimizer",
                "activations",
                "logits",
                "fsdp_gather",
                "engines",
                "kv_cache",
            )
        }
        return {
            "pool": self.pool,
            "ranks": self.ranks,
            **gib,
            "runtime": round(self.runtime / GIB, 3),
            "engines_rollout": round(self.engines_rollout / GIB, 3),
            "engines_update": round(self.engines_update / GIB, 3),
            "optimizer_in_update": round(
                (self.optimizer_training if self.optimizer_offloaded else self.optimizer) / GIB, 3
            ),
            "engines_sleep": self.sleeping,
            "rollout_phase": round(self.rollout_phase / GIB, 3),
            "update_phase": round(self.update_phase / GIB, 3),
            "total": round(self.total / GIB, 3),
            "startup": round(self.startup / GIB, 3),
            "host_steady": round(self.host_steady / GIB, 3),
            "host_startup": round(self.host_startup / GIB, 3),
            "total_typical": None if self.total_typical is None else round(self.total_typical / GIB, 3),
            "capacity": round(self.capacity / GIB, 3),
            "fits": not self.problems,
            "problems": self.problems,
        }


def learner_compute_dtype(cfg: TrainConfig, gpu: bool) -> str:
    """The dtype the learner's matmuls will run in: `learner.compute_dtype` as the run resolves it (auto: bf16
    on a GPU, assumed to support it; on a CPU, bf16 where this machine has native bf16), or the weights'
    own dtype when they are not fp32.
    """
    requested = cfg.learner.compute_dtype
    if dtype_bytes(cfg.models.dtype) != 4 or requested == "float32":
        return cfg.models.dtype
    if requested == "auto":
        from drmas_train.engines.settings import native_bf16

        return "bfloat16" if gpu or native_bf16("cpu")[0] else "float32"
    return requested


def engines_sleep(cfg: TrainConfig, backend: BackendName, gpu: bool) -> bool:
    """Whether the run's engines sleep between generations: `models.engine.sleep`, except vLLM on a CPU (its
    sleep mode needs CUDA) or serving LoRA adapters (a sleep would drop the frozen base that no push
    carries): the run says so and keeps those resident.
    """
    vllm_resident = backend == "vllm" and (not gpu or cfg.models.assignment == "lora")
    return cfg.models.engine.sleep and not vllm_resident


def rank_memory(
    cfg: TrainConfig,
    pool: PoolPlan,
    rank: str,
    *,
    generates: bool,
    gpu: bool,
    capacity: int,
    backend: BackendName,
    gen_dtype: ModelDtype,
    tokens_per_call: int | None = None,
) -> RankMemory:
    """The memory of rank(s) `rank` of `pool` (module docstring); activations for a micro-batch of calls of
    `tokens_per_call` tokens (None: `models.engine.max_model_len`, the longest a call can be).
    """
    learner = cfg.learner
    b = dtype_bytes(cfg.models.dtype)
    compute = dtype_bytes(learner_compute_dtype(cfg, gpu))
    shards = pool.size.ranks if pool.size.strategy == "fsdp" else 1
    tokens_per_call = tokens_per_call or int(cfg.models.engine.max_model_len or 0)
    caps = [cfg.rollout.max_new_tokens, *(o.max_new_tokens for o in cfg.agents.values() if o and o.max_new_tokens)]
    out = RankMemory(pool.name, rank, capacity=capacity, runtime=int(CUDA_CONTEXT_GIB * GIB) if gpu else 0)
    out.optimizer_offloaded = learner.optimizer_offload
    out.sleeping = engines_sleep(cfg, backend, gpu)
    out.engine_asleep = int(ENGINE_ASLEEP_GIB * GIB) if out.sleeping and backend == "vllm" else 0
    residual = compute if learner.residual_dtype == "compute" else b
    transient: TrainState | None = None
    for mp in pool.models:
        if mp.arch is None:
            continue
        trainable = None
        if mp.adapters:
            ranks = [cfg.agent(a).lora_rank or cfg.models.lora_rank for a in mp.agents]
            trainable = sum(lora_params(mp.arch, r, cfg.models.lora_targets) for r in ranks)
        state = train_state(
            mp.arch,
            dtype=b,
            tokens=learner.micro_batch_size * tokens_per_call,
            response_tokens=learner.micro_batch_size * max(caps),
            checkpointing=learner.gradient_checkpointing,
            chunk_mib=learner.logits_chunk_mib,
            trainable=trainable,
            shards=shards,
            compute=compute,
            residual=residual,
        )
        out.weights += state.weights
        out.optimizer += state.optimizer
        out.optimizer_training = max(out.optimizer_training, state.optimizer)
        # FSDP: built on the meta device, each rank reads its own shard from the files a layer at a time
        loading = mp.arch.layer_params() * b if shards > 1 else mp.arch.n_params() * b
        out.startup += state.weights + loading if shards > 1 else loading
        out.host_startup = max(out.host_startup, loading)
        if transient is None or state.transient > transient.transient:
            transient = state
        if generates:
            ep = engine_plan(cfg, mp, backend, gen_dtype, gpu, capacity)
            out.engine_plans.append(ep)
            out.engines += ep.memory
            out.kv_cache += ep.kv_cache
    out.startup += out.engines_rollout + out.runtime
    if transient is not None:
        out.gradients, out.activations = transient.gradients, transient.activations
        out.logits, out.fsdp_gather = transient.logits, transient.gather
    return out


def rollout_rank_memory(
    cfg: TrainConfig,
    models: list[ModelPlan],
    size: PoolSize,
    *,
    gpu: bool,
    capacity: int,
    backend: BackendName,
    gen_dtype: ModelDtype,
) -> RankMemory:
    """A rank of the rollout pool (`placement.rollout_pool`): every model's engine and nothing to train.

    A transformers engine there holds its own copy of the model (in `models.dtype`) beside its cache.
    """
    n = size.ranks
    out = RankMemory(ROLLOUT_POOL, "0" if n == 1 else f"0-{n - 1}", capacity=capacity)
    out.runtime = int(CUDA_CONTEXT_GIB * GIB) if gpu else 0
    for mp in models:
        if mp.arch is None:
            continue
        ep = engine_plan(cfg, mp, backend, gen_dtype, gpu, capacity)
        if backend != "vllm":
            ep.memory += mp.arch.n_params() * dtype_bytes(cfg.models.dtype)
        out.engine_plans.append(ep)
        out.engines += ep.memory
        out.kv_cache += ep.kv_cache
    return out


def pool_ranks(pool: PoolPlan, rollout_ranks: str, pooled: bool = False) -> list[tuple[str, bool]]:
    """The rank groups to report, each with whether it generates: rank 0, and the others when they differ.

    `pooled`: the engines live on a rollout pool, so no rank of a learner pool generates.
    """
    n = pool.size.ranks
    if pooled:
        return [("0" if n == 1 else f"0-{n - 1}", False)]
    if n == 1:
        return [("0", True)]
    if rollout_ranks == "all":  # every rank holds the same: one group
        return [(f"0-{n - 1}", True)]
    return [("0", True), ("1" if n == 2 else f"1-{n - 1}", False)]
