"""A training run: the loop and what it writes.

Modules: `trainer` (the `Trainer`: rollout -> advantages -> update -> weights back to the engines, step
after step), `workers` (the policies' learners and engines, in this process or on Ray placement pools),
`validation` (held-out evaluation during training), `metrics` (one step's metrics row), `runlog` (the
run directory: metrics.jsonl, TensorBoard, trajectories, progress line), `checkpoint` (save and resume).
"""
