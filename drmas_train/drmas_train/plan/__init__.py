"""`drmas-train plan`: what a run will cost before any GPU: data, prompt lengths, engines, memory per rank, time.

Runs anywhere: no GPU and no weights (a model's config and tokenizer from a local folder or the hub;
offline, the architecture numbers kept in `arch`). Modules: `arch` (model shapes), `memory` (the
learner's memory per model), `ranks` (per-rank memory and engines), `data` (datasets, prompt lengths),
`timing` (the wall-time estimate), `models` (config and tokenizer lookup), `build` (the whole plan as
a dict), `report` (its text form). The CPU check of the memory model: `benchmarks/drmas_benchmarks/plan_memory.py`.
"""

from drmas_train.plan.build import build_plan

__all__ = ["build_plan"]
