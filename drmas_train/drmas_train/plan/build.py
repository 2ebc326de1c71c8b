"""`build_plan`: everything `drmas-train plan` reports, as one JSON-able dict.

Data (`plan.data`), models (`plan.models`), per-rank memory (`plan.ranks`) and the time estimate
(`plan.timing`) are put together here; `plan.report` renders the dict as text.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from drmas_train.config import BackendName, ModelDtype, TrainConfig, needed_model_len, steps_for_epochs
from drmas_train.plan.data import (
    PromptCounter,
    eval_kwargs,
    load_env,
    percentile_stats,
    sample_indices,
    walk_prompts,
)
from drmas_train.plan.memory import GIB, dtype_bytes
from drmas_train.plan.models import ModelInfo, model_info
from drmas_train.plan.ranks import (
    ModelPlan,
    PoolPlan,
    learner_compute_dtype,
    model_plans,
    pool_plans,
    pool_ranks,
    rank_memory,
    rollout_rank_memory,
)
from drmas_train.plan.timing import CPU_2CORE, GPUS, EngineLoad, Hardware, learner_s, turn_s

REPLY_FILL = 0.5
"""Assumed mean reply length as a share of the response cap (the GPU plan of
benchmarks/results/scaling_notes.md, section 2, assumes 2,000 of 4,096 for the math Solver); the first steps'
`response_tokens/<agent>` metrics replace it."""


def turn_agents(env_id: str, kwargs: dict[str, Any], agents: list[str]) -> tuple[list[str], str]:
    """The agents of an episode's longest run of sequential turns, and where that comes from."""
    if env_id == "math-2agent":
        loops = int(kwargs.get("max_loops", 2))
        return ["solver", "verifier"] * (loops - 1) + ["solver"], f"math-2agent, max_loops {loops}"
    if env_id.startswith("search-") and {"verifier", "search", "answer"} <= set(agents):
        steps = int(kwargs.get("max_steps", 4))
        return ["verifier", "search"] * (steps - 1) + ["verifier", "answer"], f"search, max_steps {steps}"
    return list(agents), f"{env_id}: one call per agent (assumed: the env's turn rule is not known to the plan)"


def _gpu(cfg: TrainConfig) -> bool:
    p = cfg.placement
    pools = (
        [p.shared_pool] if p.mode == "shared" else [p.default_pool, *p.pools.values()] if p.mode == "per_agent" else []
    )
    if p.rollout_pool is not None:
        pools.append(p.rollout_pool)
    return cfg.models.device == "cuda" or any(s.gpus > 0 for s in pools)


def _host_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _caps(cfg: TrainConfig, agents: list[str]) -> dict[str, int]:
    r = cfg.rollout
    return {a: cfg.agent(a).max_new_tokens or r.max_new_tokens for a in agents}


def _backend(cfg: TrainConfig) -> str:
    import importlib.util

    if cfg.models.backend != "auto":
        return cfg.models.backend
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def _gen_dtype(cfg: TrainConfig, gpu: bool, backend: BackendName) -> ModelDtype:
    """The engine's dtype as the run would resolve it: on a GPU `auto` means bf16 (assumed supported); on a
    CPU, bf16 where this machine has native bf16 (`models.engine.resolve_gen_dtype`).
    """
    from drmas_train.engines.settings import resolve_gen_dtype

    if gpu:
        g = cfg.models.gen_dtype
        return "bfloat16" if g == "auto" else g or cfg.models.dtype
    m = cfg.models
    return resolve_gen_dtype(m.gen_dtype, dtype=m.dtype, backend=backend, device_type="cpu") or m.dtype


def _prompt_section(
    cfg: TrainConfig, env: Any, agents: list[str], infos: dict[str, ModelInfo], plans: list[ModelPlan], sample: int
) -> dict[str, Any]:
    cap = cfg.rollout.max_prompt_tokens
    out: dict[str, Any] = {"max_prompt_tokens": cap, "per_agent": [], "status": "no data"}
    if env is None:
        out["note"] = "no data: the training set could not be loaded"
        return out
    by_agent = {a: next(mp for mp in plans if a in mp.agents) for a in agents}
    counters = {a: PromptCounter(infos[by_agent[a].name].tokenizer, cfg.template_kwargs(a)) for a in agents}
    indices = sample_indices(len(env.unwrapped.tasks), sample, cfg.seed)
    lengths, stopped = walk_prompts(env, indices, counters, _caps(cfg, agents))
    estimated = any(c.tokenizer is None for c in counters.values())
    out["status"] = "estimate (no tokenizer for some models: characters / 4)" if estimated else "measured"
    out["sample_tasks"] = len(indices)
    out["note"] = (
        "first: the episode's first call, exact; later: calls after earlier replies, built with every reply "
        "a filler at its response cap (the longest prompts the env can build from those turns: a bound)"
        + (f"; {stopped}" if stopped else "")
    )
    rows = [percentile_stats(a, t, v, cap, counters[a].unit) for (a, t), v in sorted(lengths.items())]
    out["per_agent"] = [asdict(r) for r in rows]
    every = [n for v in lengths.values() for n in v]
    if every:
        all_stats = percentile_stats("all", "all", every, cap, rows[0].unit)
        out.update(p50=all_stats.p50, p99=all_stats.p99, max=all_stats.max, truncated_share=all_stats.truncated_share)
    return out


def _engine_dict(e: Any) -> dict[str, Any]:
    d = asdict(e)
    d["memory_gib"] = round(d.pop("memory") / GIB, 3)
    d["kv_cache_gib"] = round(d.pop("kv_cache") / GIB, 3)
    return d


def _memory_section(
    cfg: TrainConfig,
    pools: list[PoolPlan],
    gpu: bool,
    backend: BackendName,
    gen_dtype: ModelDtype,
    prompts: dict[str, Any],
) -> dict[str, Any]:
    declared = cfg.placement.gpu_memory_gib
    rows = []
    # The same ranks with calls as long as the measured prompts' p99 plus the largest response cap.
    typical = None
    if prompts.get("p99") is not None and prompts["status"] == "measured":
        longest_cap = needed_model_len(cfg)[0] - cfg.rollout.max_prompt_tokens
        typical = min(int(prompts["p99"]) + longest_cap, int(cfg.models.engine.max_model_len or 0))
    pooled = cfg.placement.rollout_pool

    def capacity(size: Any) -> int:
        return int((size.gpus if size.gpus >= 1 else 1.0) * declared * GIB if gpu else _host_bytes())

    for pool in pools:
        per_rank = capacity(pool.size)
        for rank, generates in pool_ranks(pool, cfg.placement.rollout_ranks, pooled is not None):
            kw = dict(generates=generates, gpu=gpu, capacity=int(per_rank), backend=backend, gen_dtype=gen_dtype)
            row = rank_memory(cfg, pool, rank, **kw)
            rows.append(row)
            if typical:
                row.total_typical = rank_memory(cfg, pool, rank, **kw, tokens_per_call=typical).total
    if pooled is not None:  # engines only; a rank holds every model's (`placement.rollout_pool`)
        models = [mp for pool in pools for mp in pool.models]
        kw = dict(gpu=gpu, capacity=capacity(pooled), backend=backend, gen_dtype=gen_dtype)
        rows.append(rollout_rank_memory(cfg, models, pooled, **kw))
    unknown = [mp.name for pool in pools for mp in pool.models if mp.arch is None]
    startup_problems = [
        f"pool {r.pool} rank(s) {r.ranks}: start-up needs {r.startup / GIB:.1f} GiB of {r.capacity / GIB:.1f} GiB "
        "(its models' shards and one layer being read under FSDP, each model whole otherwise; its engines)"
        for r in rows
        if r.startup > r.capacity
    ]
    return {
        "device": "gpu" if gpu else "cpu",
        "declared": declared if gpu else round(_host_bytes() / GIB, 1),
        "declared_from": "placement.gpu_memory_gib" if gpu else "this machine's memory (a CPU run)",
        "per_rank": [r.as_dict() for r in rows],
        "_engines": [_engine_dict(e) for r in rows if r.ranks.startswith("0") for e in r.engine_plans],
        "unknown_models": unknown,
        "fits": None if unknown else all(not r.problems for r in rows),
        "phases": "total = the larger of rollout_phase and update_phase; startup apart",
        "startup_fits": None if unknown else not startup_problems,
        "startup_problems": startup_problems,
        "host_per_node": _host_per_node(cfg, pools, rows) if gpu else None,
        "basis": (
            f"micro-batch of {cfg.learner.micro_batch_size} calls of max_model_len "
            f"{cfg.models.engine.max_model_len} tokens (the longest a call can be), "
            f"learner dtype {cfg.models.dtype}, compute {learner_compute_dtype(cfg, gpu)}, hidden states between "
            f"layers {cfg.learner.residual_dtype}, gradient checkpointing "
            f"{'on' if cfg.learner.gradient_checkpointing else 'off'}"
        ),
        "typical_call_tokens": typical,
        "typical_basis": (
            f"total_typical: the same micro-batch of calls of {typical} tokens (measured prompt p99 + the largest "
            "response cap)"
            if typical
            else "no measured prompts: no typical total"
        ),
        "projection": gpu,
        "_rows": rows,
    }


def _host_per_node(cfg: TrainConfig, pools: list[PoolPlan], rows: list[Any]) -> dict[str, Any]:
    """Host memory of one node: its ranks' offloaded optimizer state, and what they load at start-up.

    A bound: every rank of the node counted at the largest per-rank figure of any pool.
    """
    sizes = [p.size for p in pools] + [s for s in [cfg.placement.rollout_pool] if s is not None]
    ranks = min(sum(s.ranks for s in sizes), cfg.placement.gpus_per_node)
    steady = ranks * max((r.host_steady for r in rows), default=0)
    startup = ranks * max((r.host_startup for r in rows), default=0)
    capacity = cfg.placement.host_memory_gib * GIB
    return {
        "ranks": ranks,
        "steady": round(steady / GIB, 3),
        "startup": round(startup / GIB, 3),
        "capacity": cfg.placement.host_memory_gib,
        "fits": max(steady, startup) <= capacity,
        "basis": (
            "steady: the offloaded optimizer state of each rank; startup: what each rank reads beyond file-backed "
            "pages (one layer under FSDP, its largest model whole otherwise)"
        ),
    }


def _estimate(
    cfg: TrainConfig,
    agents: list[str],
    pools: list[PoolPlan],
    plans: list[ModelPlan],
    prompts: dict[str, Any],
    memory: dict[str, Any],
    gen_dtype: ModelDtype,
) -> dict[str, Any]:
    gpu, backend, env_id = memory["device"] == "gpu", memory["_backend"], cfg.env.id
    hw: Hardware = GPUS[cfg.placement.gpu_kind] if gpu else CPU_2CORE
    if not gpu and backend != "vllm":
        hw = replace(hw, bandwidth_efficiency=hw.bandwidth_efficiency * 56 / 167)
    turns, turns_from = turn_agents(env_id, cfg.env.kwargs, agents)
    caps = _caps(cfg, agents)
    p50 = {r["agent"]: r["p50"] for r in prompts.get("per_agent", [])}
    # An agent whose prompts the walk did not reach: the p50 of every measured prompt, else half the cap.
    fallback = prompts.get("p50") or cfg.rollout.max_prompt_tokens / 2
    model_of = {a: next(mp for mp in plans if a in mp.agents) for a in agents}
    pool_of = {mp.key: next(p for p in pools if mp in p.models) for mp in plans}
    kv_tokens = {e["model"]: e["kv_tokens"] for e in memory["_engines"]}
    episodes = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    gen_b = dtype_bytes(gen_dtype)

    def rollout(n_episodes: int) -> float:
        total = 0.0
        for agent in turns:
            mp = model_of[agent]
            if mp.arch is None:
                continue
            pool = pool_of[mp.key]
            gens = pool.size.ranks if cfg.placement.rollout_ranks == "all" else 1
            if cfg.placement.rollout_pool is not None:  # the rollout pool's replicas
                gens = cfg.placement.rollout_pool.ranks
            load = EngineLoad(
                weight_bytes=mp.arch.n_params() * gen_b,
                kv_bytes_per_token=mp.arch.kv_bytes_per_token(gen_b),
                sequences=math.ceil(n_episodes / gens),
                mean_context=p50.get(agent, fallback) + caps[agent] / 2,
                kv_capacity_tokens=kv_tokens.get(mp.key) if backend == "vllm" and gpu else None,
            )
            total += turn_s(load, caps[agent], hw)
        return total

    learn_by_pool: dict[str, float] = {}
    for mp in plans:
        if mp.arch is None:
            continue
        tokens = sum(episodes * (p50.get(a, fallback) + REPLY_FILL * caps[a]) for a in turns if a in mp.agents)
        pool = pool_of[mp.key]
        devices = pool.size.ranks * (max(1, int(pool.size.gpus)) if gpu else 1)
        if not gpu:
            cores = cfg.threads or os.cpu_count() or 1  # CPU_2CORE's calibrated rate per core, either dtype
            hw = replace(hw, flops_fp32=65e9 * cores, flops_bf16=65e9 * cores)
        secs = cfg.learner.ppo_epochs * learner_s(
            mp.arch.n_params(),
            tokens,
            devices,
            hw,
            bf16=dtype_bytes(learner_compute_dtype(cfg, gpu)) == 2,
            checkpointing=cfg.learner.gradient_checkpointing,
        )
        learn_by_pool[pool.name] = learn_by_pool.get(pool.name, 0.0) + secs
    roll = rollout(episodes)
    learn = max(learn_by_pool.values(), default=0.0)  # pools train at the same time
    # Rollout and update take turns, unless a rollout pool samples the next steps while the learners train.
    overlapped = cfg.placement.rollout_pool is not None and cfg.rollout.max_staleness > 0
    step = max(roll, learn) if overlapped else roll + learn
    ev = cfg.eval
    n_val = (1 if ev.before_train else 0) + (
        cfg.steps // ev.every + (1 if cfg.steps % ev.every else 0) if ev.every else 0
    )
    used = memory.get("_eval_used") or ev.n_problems
    val_episodes = used * (ev.k + (1 if ev.greedy else 0))
    waves = math.ceil(val_episodes / ev.batch_episodes)
    val = waves * rollout(min(val_episodes, ev.batch_episodes)) if n_val else 0.0
    run = cfg.steps * step + n_val * val
    sizes = [p.size for p in pools] + [s for s in [cfg.placement.rollout_pool] if s is not None]
    n_gpus = sum(s.ranks * s.gpus for s in sizes) if gpu else 0
    return {
        "hardware": hw.name,
        "rollout_s_per_step": round(roll, 1),
        "learner_s_per_step": round(learn, 1),
        "step_s": round(step, 1),
        "validations": n_val,
        "validation_s_each": round(val, 1),
        "run_hours": round(run / 3600, 2),
        "gpus": n_gpus,
        "gpu_hours_per_step": round(step / 3600 * n_gpus, 3),
        "gpu_hours": round(run / 3600 * n_gpus, 1),
        "assumptions": [
            "an estimate, not a measurement",
            f"hardware: {hw.source}",
            f"turns per episode: {len(turns)} ({turns_from}), each lasting its longest reply at the cap "
            "(lock-step rollout; every turn taken)",
            f"learner tokens: the agent's prompt p50 (an agent not measured: all prompts' p50, or half the prompt "
            f"cap without data) + {REPLY_FILL:.0%} of the response cap per call",
            "learner FLOPs: 10 x parameters per token with gradient checkpointing, 8 without",
            "not counted: weight pushes, engine start-up, checkpoints",
            *(
                ["step: the longer of rollout and update (a rollout pool with max_staleness >= 1)"]
                if overlapped
                else []
            ),
        ],
    }


def build_plan(
    cfg: TrainConfig, *, preset: str | None = None, offline: bool = False, sample: int = 128
) -> dict[str, Any]:
    """The plan of a run (see the package docstring); a JSON-able dict."""
    import drmas_envs

    env, train = load_env(cfg.env.id, cfg.env.kwargs, "train")
    per_step = cfg.rollout.prompts_per_step
    per_epoch = train.size // per_step if train.size else None  # whole batches: the trainer's count
    steps_from = "steps"
    if train.size and not per_epoch:
        steps_from = f"`steps`; the {train.size} training tasks do not fill one batch of {per_step}: the run stops"
    elif cfg.epochs is not None and train.size:
        cfg = replace(cfg, steps=steps_for_epochs(cfg.epochs, train.size, per_step))
        steps_from = f"{cfg.epochs:g} epochs x {per_epoch} steps per epoch (the trainer's count)"
    elif cfg.epochs is not None:
        steps_from = f"`steps`: {cfg.epochs:g} epochs cannot be counted without the training data"
    probe = env or drmas_envs.make(cfg.env.id)  # the agents, from the env's built-in data when the set is missing
    agents = list(probe.possible_agents)
    ev = None
    if cfg.eval.enabled:
        _, ev = load_env(cfg.env.id, eval_kwargs(cfg.env.kwargs, cfg), "eval")
        if ev.size is not None:
            ev.used = min(cfg.eval.n_problems, ev.size)
    names = sorted({cfg.models.name, *cfg.models.per_agent_names.values()})
    infos: dict[str, ModelInfo] = {n: model_info(n, offline=offline) for n in names}
    plans: list[ModelPlan] = model_plans(cfg, agents, {n: i.arch for n, i in infos.items()})
    gpu = _gpu(cfg)
    pools = pool_plans(cfg, plans, gpu)
    backend = _backend(cfg)
    gen_dtype = _gen_dtype(cfg, gpu, backend)
    prompts = _prompt_section(cfg, env, agents, infos, plans, sample)
    memory = _memory_section(cfg, pools, gpu, backend, gen_dtype, prompts)
    memory["_eval_used"] = ev.used if ev else None
    memory["_backend"] = backend
    estimate = _estimate(cfg, agents, pools, plans, prompts, memory, gen_dtype)
    engines = memory.pop("_engines")
    for key in ("_rows", "_eval_used", "_backend"):
        memory.pop(key)
    missing = [d.missing for d in (train, ev) if d is not None and d.missing]
    return {
        "preset": preset,
        "reference": cfg.reference,
        "reproduces": cfg.reproduces,
        "env": cfg.env.id,
        "agents": agents,
        "train_dataset": asdict(train),
        "eval_dataset": asdict(ev) if ev else None,
        "missing_data": missing,
        "steps": cfg.steps,
        "steps_from": steps_from,
        "episodes_per_step": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
        "steps_per_epoch": per_epoch,
        "epochs": cfg.epochs if cfg.epochs is not None else round(cfg.steps / per_epoch, 2) if per_epoch else None,
        "prompt_tokens": prompts,
        "truncated_share": prompts.get("truncated_share"),
        "models": [
            {
                "key": mp.key,
                "name": mp.name,
                "agents": mp.agents,
                "params": mp.arch.n_params() if mp.arch else None,
                "layer_params": mp.arch.layer_params() if mp.arch else None,
                "source": infos[mp.name].note,
            }
            for mp in plans
        ],
        "engines": engines,
        "gpu_memory_gib": memory,
        "fits": memory["fits"],
        "estimate": estimate,
    }
