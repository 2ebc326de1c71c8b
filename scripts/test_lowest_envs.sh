#!/usr/bin/env bash
# drmas-envs alone, in a fresh virtual environment, at the lowest versions its pyproject.toml declares
# (uv's lowest-direct resolution: each direct dependency at its floor), then the env tests in it.
# No torch, no vLLM, no drmas-train: the env tests that need vLLM are deselected (marker `vllm`), and so
# is the light-install test (it builds its own venv at the newest versions; the main suite runs it).
# Most of its time is the tests. Run by .ci/run; by hand: bash scripts/test_lowest_envs.sh (WORKERS=0: one process)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install -q uv
UV="$WORK/tools/bin/uv"
"$UV" venv -q -p "$PY" "$WORK/venv"
VPY="$WORK/venv/bin/python"
# Build from a copy, so the checkout gets no build/ or egg-info folder.
cp -r drmas_envs "$WORK/drmas_envs"
rm -rf "$WORK/drmas_envs/build" "$WORK/drmas_envs/"*.egg-info
"$UV" pip install -q -p "$VPY" --resolution lowest-direct "$WORK/drmas_envs"
"$UV" pip install -q -p "$VPY" pytest pytest-timeout pytest-xdist  # test tools at their newest: not drmas-envs' floors
# Every declared floor is what got installed (a floor that cannot be installed here fails the step).
"$VPY" - drmas_envs/pyproject.toml <<'EOF'
import importlib.metadata as md
import re
import sys
import tomllib

deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
bad = []
for dep in deps:
    name, floor = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", dep.split(";")[0].strip()).groups()
    got = md.version(name)
    print(f"{name:>12}  floor {floor:<8} installed {got}")
    if got.split("+")[0] not in (floor, floor + ".0", floor + ".0.0"):
        bad.append(f"{name}: floor {floor}, installed {got}")
assert "torch" not in {d.metadata["Name"] for d in md.distributions()}, "torch got installed"
sys.exit(f"not at the floors: {bad}" if bad else 0)
EOF
# From the checkout's tests; the package imported is the venv's copy (checked first).
"$VPY" -c "import drmas_envs, sys; assert drmas_envs.__file__.startswith(sys.prefix), drmas_envs.__file__"
# On two workers: many of these tests wait on grading workers (their bounds, their start), not on a core.
"$VPY" -m pytest -q -p no:cacheprovider -n "${WORKERS:-2}" tests/envs -m "not vllm" \
  --deselect tests/envs/test_light_install.py::test_light_install_has_no_torch_and_works
