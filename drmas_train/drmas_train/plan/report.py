"""The text form of a plan (`drmas-train plan` without `--json`)."""

from __future__ import annotations

from typing import Any


def _dataset(d: dict[str, Any] | None, role: str) -> list[str]:
    if d is None:
        return [f"{role}: none (validation off)"]
    if d["missing"]:
        return [f"{role}: {d['name']}: NOT FOUND", f"  {d['missing']}"]
    used = f", first {d['used']} used" if d.get("used") is not None else ""
    sources = ", ".join(f"{k} {v}" for k, v in sorted(d["sources"].items()))
    return [f"{role}: {d['name']}: {d['size']} tasks{used}" + (f" ({sources})" if sources else "")]


def _prompts(p: dict[str, Any]) -> list[str]:
    cap = p["max_prompt_tokens"]
    if not p["per_agent"]:
        return [f"prompt tokens (cap rollout.max_prompt_tokens {cap}): {p.get('note', 'no data')}"]
    lines = [f"prompt tokens ({p['status']}; {p['sample_tasks']} tasks; cap rollout.max_prompt_tokens {cap}):"]
    for r in p["per_agent"]:
        lines.append(
            f"  {r['agent']:<10} {r['turn']:<6} n {r['n']:>4}  p50 {r['p50']:>7.0f}  p99 {r['p99']:>7.0f}  "
            f"max {r['max']:>6}  truncated {r['truncated_share']:.1%}"
        )
    lines.append(
        f"  all calls: p50 {p['p50']:.0f}, p99 {p['p99']:.0f}, max {p['max']}, truncated {p['truncated_share']:.1%}"
    )
    lines.append(f"  ({p['note']})")
    return lines


def _memory(m: dict[str, Any]) -> list[str]:
    kind = "GPU" if m["device"] == "gpu" else "process"
    head = f"memory per {kind} rank, GiB ({m['basis']}; against {m['declared']} GiB, {m['declared_from']}):"
    lines = [head]
    # engines: while generating (all of them, or the one awake and the others asleep)
    cols = ("weights", "gradients", "optimizer", "activations", "logits", "fsdp_gather", "engines_rollout", "runtime")
    cols += ("total",)
    lines.append("  " + f"{'pool/ranks':<18}" + "".join(f"{c.removesuffix('_rollout'):>12}" for c in cols))
    for r in m["per_rank"]:
        row = "".join(f"{r[c]:>12.2f}" for c in cols)
        lines.append(f"  {r['pool'] + ' ' + r['ranks']:<18}{row}   {'fits' if r['fits'] else 'DOES NOT FIT'}")
        lines.append(
            f"    phases: rollout {r['rollout_phase']:.2f}, update {r['update_phase']:.2f} (total: the larger); "
            f"start-up {r['startup']:.2f}"
        )
        if r["engines_sleep"]:
            lines.append(
                f"    engines sleep: {r['engines_rollout']:.2f} while generating (one awake), "
                f"{r['engines_update']:.2f} in updates (all asleep; {r['engines']:.2f} if all were awake)"
            )
        if r["total_typical"] is not None:
            lines.append(
                f"    at the measured prompt lengths ({m['typical_call_tokens']}-token calls): {r['total_typical']:.2f}"
            )
        lines += [f"    - {p}" for p in r["problems"]]
    lines += [f"  - {p}" for p in m["startup_problems"]]
    host = m["host_per_node"]
    if host:
        lines.append(
            f"  host memory per node ({host['ranks']} ranks), GiB: steady {host['steady']:.1f} (offloaded optimizer "
            f"state), start-up {host['startup']:.1f} (read beyond file-backed pages), against {host['capacity']} "
            f"(placement.host_memory_gib): {'fits' if host['fits'] else 'DOES NOT FIT'}"
        )
    if m["unknown_models"]:
        lines.append(f"  not planned (architecture unknown): {', '.join(m['unknown_models'])}")
    if m["projection"]:
        lines.append("  (GPU figures are projections: vLLM's budget and KV cache, FSDP sharding and the CUDA context")
        lines.append(
            "   have not been measured on a GPU; the learner's parts are checked on CPU: "
            "benchmarks/results/plan_memory.md)"
        )
    return lines


def render(plan: dict[str, Any]) -> str:
    """The plan as the text `drmas-train plan` prints."""
    lines = [f"plan of {plan['preset'] or 'the config'}: env {plan['env']}, agents {', '.join(plan['agents'])}"]
    if plan["reference"]:
        lines.append(f"reproduces: {plan['reference']}: {plan['reproduces']}")
    lines += _dataset(plan["train_dataset"], "train data")
    lines += _dataset(plan["eval_dataset"], "eval data")
    spe = plan["steps_per_epoch"]
    per_epoch = f"{spe} steps per epoch ({plan['epochs']} epochs)" if spe is not None else None
    lines.append(
        f"steps: {plan['steps']} x {plan['episodes_per_step']} episodes (from {plan['steps_from']}); "
        + (per_epoch or "steps per epoch: unknown (no training data)")
    )
    lines += _prompts(plan["prompt_tokens"])
    lines.append("models:")
    lines += [
        f"  {m['key']}: {m['name']} ({(m['params'] or 0) / 1e9:.2f} B parameters; {m['source']})"
        for m in plan["models"]
    ]
    lines.append("engines:")
    for e in plan["engines"]:
        util = f", gpu_memory_utilization {e['gpu_memory_utilization']}" if e["gpu_memory_utilization"] else ""
        lines.append(
            f"  {e['model']}: {e['backend']}, max_model_len {e['max_model_len']}{util}, dtype {e['dtype']}, "
            f"KV cache {e['kv_cache_gib']:.2f} GiB = {e['kv_tokens']} tokens"
        )
    lines += _memory(plan["gpu_memory_gib"])
    verdict = {True: "fits", False: "DOES NOT FIT", None: "unknown"}[plan["fits"]]
    lines.append(f"verdict: {verdict}")
    est = plan["estimate"]
    lines.append(
        f"time (ESTIMATE on {est['hardware']}): step {est['step_s']:.0f} s "
        f"(rollout {est['rollout_s_per_step']:.0f}, learner {est['learner_s_per_step']:.0f}); "
        f"{est['validations']} validations of {est['validation_s_each']:.0f} s; run {est['run_hours']:.1f} h; "
        f"{est['gpu_hours_per_step']:.3f} GPU-hours per step, {est['gpu_hours']:.1f} for the run ({est['gpus']:g} GPUs)"
    )
    lines += [f"  assumes: {a}" for a in est["assumptions"]]
    for m in plan["missing_data"]:
        lines.append(f"missing data: {m}")
    return "\n".join(lines)
