#!/usr/bin/env bash
# GPU check: one math-preset-shaped step of a Qwen3-4B-shaped model (random weights made on the GPU,
# nothing downloaded) on one GPU, timed against its floor; prints one table (python -m drmas_benchmarks.gpu_check).
# Uses vLLM where it imports, else the transformers backend in bf16 (on one H200 with the transformers
# backend and --response-tokens 2048: 356 s; docs/gpus.md, "The GPU check").
# Extra arguments go to the script, e.g. --eager, --micro-batch 4, --response-tokens 2048, --json out.json.
#
#   bash scripts/gpu_check.sh                 # on the GPU machine, from the repository root
#   bash scripts/gpu_check.sh --cpu-smoke     # the same code on CPU with a tiny model (what CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
# Without an install, run from the source folders; install the missing pure-Python deps if pip can reach
# an index (a GPU image normally brings torch, transformers and vllm).
if ! "$PY" -c "import drmas_train" 2>/dev/null; then
  export PYTHONPATH="$PWD/drmas_train:$PWD/drmas_envs${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import drmas_benchmarks" 2>/dev/null; then
  export PYTHONPATH="$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c "import torch, transformers, numpy, yaml" 2>/dev/null; then
  "$PY" -m pip install -q torch "transformers>=5,<5.20" numpy pyyaml
fi
exec "$PY" -m drmas_benchmarks.gpu_check "$@"
