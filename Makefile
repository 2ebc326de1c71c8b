# Two commands run everything (see README): `make train` and `make test`.
PY ?= python3
VENV ?= .venv
# Test workers (pytest-xdist; tests/conftest.py says which tests share one). WORKERS=0: one process.
WORKERS ?= 2
BIN = $(VENV)/bin

.PHONY: setup train test lint format bench

$(BIN)/.installed: drmas_envs/pyproject.toml drmas_train/pyproject.toml retrieval/pyproject.toml \
  benchmarks/pyproject.toml scripts/setup.sh
	PY=$(PY) VENV=$(VENV) bash scripts/setup.sh
	touch $@

setup: $(BIN)/.installed

train: setup  ## the main job on its embedded default: Dr. MAS on math-2agent, SmolLM2-135M, CPU
	$(BIN)/drmas-train --env math-2agent $(ARGS)

test: setup  ## the test suite
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup $(ARGS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .
