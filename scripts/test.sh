#!/usr/bin/env bash
# Install blockscaled with its test dependencies into ./.venv and run the test suite.
# Works on a fresh machine without a GPU (kernels run in the Triton interpreter) and on a
# CUDA machine (GPU-marked tests run too). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# CPU build of torch (a local wheel on the project machines); triton 3.6 is the GPU
# machine's version; numpy<2.3 because the 3.6 interpreter fails on scalar args with 2.4.
python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.3"
python -m pip install -q -e ".[test]"
python -m pytest -q "$@"
