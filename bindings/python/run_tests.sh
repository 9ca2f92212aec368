#!/usr/bin/env bash
# Builds the Python binding, installs it into the current python3 and runs its pytest suite;
# exits non-zero on any failure.
#
#   bash bindings/python/run_tests.sh [pytest arguments...]
#
# Environment: PYTHON (default python3); FP4RL_WITH_CUDA=ON|OFF for the libfp4rl built into the
# package (default: ON when a GPU is visible, else OFF: compiling the CUDA backend takes minutes
# and buys nothing on a machine that cannot run it). The build tree is kept in
# bindings/python/build/, so a second run only recompiles what changed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"

echo "== fp4rl python: requirements ($("$py" --version 2>&1) at $(command -v "$py")) =="
need=()
"$py" -c "import scikit_build_core" 2>/dev/null || need+=("scikit-build-core>=0.9")
"$py" -c "import numpy" 2>/dev/null || need+=("numpy")
"$py" -c "import pytest" 2>/dev/null || need+=("pytest")
if ! command -v swig >/dev/null 2>&1 && ! command -v swig4.0 >/dev/null 2>&1; then
  need+=("swig>=4")  # PyPI's SWIG wheel, when the system has none
fi
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  "$py" -m pip install -q "${need[@]}"
fi
# optional: BF16 arrays in the tests (they skip without it)
"$py" -c "import ml_dtypes" 2>/dev/null || "$py" -m pip install -q ml_dtypes || echo "ml_dtypes not installed: its tests skip"
# a pip-installed swig lands in the interpreter's scripts directory
export PATH="$PATH:$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"

cuda="${FP4RL_WITH_CUDA:-}"
if [[ -z "$cuda" ]]; then
  cuda=OFF
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then cuda=ON; fi
fi

echo "== fp4rl python: build and install (CUDA backend $cuda) =="
# No build isolation: the build requirements are the ones checked above, so no network is needed.
"$py" -m pip install --no-build-isolation --no-deps -q "$here" -C "cmake.define.FP4RL_WITH_CUDA=$cuda"

echo "== fp4rl python: tests =="
cd "$here"  # the src/ layout keeps the source tree off sys.path: the tests import the installed package
"$py" -c "import fp4rl; print('fp4rl', fp4rl.__version__, 'from', fp4rl.__file__)"
OPENBLAS_NUM_THREADS=1 FP4RL_FIXTURES="$repo/tests/fixtures" FP4RL_HEADER="$repo/abi/include/fp4rl/fp4rl.h" \
  "$py" -m pytest -q -p no:cacheprovider tests "$@"
