#!/usr/bin/env bash
# Install blockscaled with its test dependencies into a virtual environment and run the tests.
# Works on a fresh machine without a GPU (kernels run in the Triton interpreter) and on a CUDA
# machine (GPU-marked tests run too). Extra arguments go to pytest.
#
#   bash scripts/test.sh                 # pinned pair: triton 3.6.0 + a torch in range, in ./.venv
#   DEPS=latest bash scripts/test.sh     # whatever pip resolves in pyproject's ranges, ./.venv-latest
#   VENV=/some/dir bash scripts/test.sh  # another environment folder
#
# The pinned pair is the GPU machine's triton, 3.6.0, with the newest torch in pyproject's range
# that allows it: torch 2.11 from PyPI (CUDA builds of 2.12+ pin newer trions), or the CPU build of
# 2.13.0 on the project machines, a local wheel without a triton requirement. A warm environment
# is reused: the install step runs again only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEPS=${DEPS:-pinned}
case "$DEPS" in
  pinned) VENV=${VENV:-.venv}; PINS=("torch>=2.11,<2.15" "triton==3.6.0") ;;
  latest) VENV=${VENV:-.venv-latest}; PINS=() ;;
  *) echo "test.sh: DEPS must be 'pinned' or 'latest', got '$DEPS'" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
STAMP="$VENV/.blockscaled-install"
WANT="$DEPS $(cat pyproject.toml scripts/test.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  # pip's notes about this machine's local package folders are not ours: filtered out.
  {
    python -m pip install -q --upgrade pip
    python -m pip install -q ${PINS[@]+"${PINS[@]}"} -e ".[test]"
  } 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
  echo "$WANT" > "$STAMP"
fi
python -c "import torch, triton, numpy; print(f'torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}')"
# Without a GPU: one worker per core, up to 4 (the interpreter runs one Python thread per test;
# torch's own threads would only contend with the other workers). With a GPU: one process, so
# that the timing tests do not share the device.
WORKERS=$(python -c "import os, torch; print(1 if torch.cuda.is_available() else min(4, len(os.sched_getaffinity(0))))")
XDIST=()
if [ "$WORKERS" -gt 1 ]; then
  XDIST=(-n "$WORKERS")
  export OMP_NUM_THREADS=1
fi
python -m pytest -q ${XDIST[@]+"${XDIST[@]}"} "$@"
