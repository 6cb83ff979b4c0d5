#!/usr/bin/env bash
# Run the GPU suites on another triton release than the GPU image's (3.6): the image has no network,
# so the release travels with the working tree as a slim package for its python (3.12).
#
#   bash scripts/checks/carry_triton.sh build 3.8.0   # -> .triton-carry/triton-3.8.0.tar.xz (~46-48 MB)
#   bash scripts/checks/carry_triton.sh hide          # before the device call: see below
#   bash scripts/checks/carry_triton.sh restore       # after it
#
# On the device (the call's carry names ".triton-carry"):
#   mkdir -p /tmp/tr && tar xJf .triton-carry/triton-3.8.0.tar.xz -C /tmp/tr
#   export PYTHONPATH=/tmp/tr:$PWD/src TRITON_CACHE_DIR=/tmp/tc-3.8
# then pytest / scripts as usual (`python -c "import triton; print(triton.__version__)"` says which
# release runs; the image's torch 2.11 imports triton only where it compiles, so the carried one is
# the one our kernels use).
#
# Why slim: a device call carries at most 64 MiB (working tree included) and the wheel is ~248 MB.
# What is left out is not used to build or launch sm_90 kernels: the profiler's and CUPTI's
# libraries, Blackwell's ptxas, cuobjdump / nvdisasm (the image has its own), static archives,
# bytecode caches; libtriton.so is stripped of its symbols (505 -> 192 MB) and the whole
# compressed with xz -9e. The AMD backend's Python stays: Gluon imports it.
#
# `hide`: the tracked working tree is ~40 MB, most of it the two bench records
# (benchmarks/results/*/runs.jsonl, 31 MB), so tree + package exceed the limit. `hide` untracks them
# in the index only (git rm --cached) and excludes them, so the call does not copy them; `restore`
# puts the index back. Nothing is committed in between.
#
# First used in the fortieth session (benchmarks/NOTES.md): the MX / NV sm_90 kernels checked on
# 3.7.1 and 3.8.0, the releases torch 2.12-2.14's CUDA builds pin.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=(benchmarks/results/h100/runs.jsonl benchmarks/results/h200/runs.jsonl)
EXCL=.git/info/exclude
case "${1:-}" in
  build)
    VER=${2:?usage: carry_triton.sh build VERSION}
    DEST=.triton-carry
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$WORK" "triton==$VER" \
      2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
    (cd "$WORK" && unzip -q triton-*.whl 'triton/*')
    T="$WORK/triton"
    rm -rf "$T"/backends/nvidia/lib/cupti* "$T"/backends/nvidia/bin/ptxas-blackwell "$T"/_C/libproton.so \
      "$T"/instrumentation "$T"/backends/nvidia/bin/cuobjdump "$T"/backends/nvidia/bin/nvdisasm
    find "$T" -name '*.a' -delete
    find "$T" -name __pycache__ -prune -exec rm -rf {} +
    strip --strip-unneeded "$T/_C/libtriton.so"
    mkdir -p "$DEST"
    (cd "$WORK" && tar cf - triton | xz -T2 -9e > "$OLDPWD/$DEST/triton-$VER.tar.xz")
    ls -la "$DEST/triton-$VER.tar.xz"
    ;;
  hide)
    git rm -q --cached "${RUNS[@]}"
    for f in "${RUNS[@]}"; do grep -qxF "/$f" "$EXCL" 2>/dev/null || echo "/$f" >> "$EXCL"; done
    echo "untracked in the index: ${RUNS[*]} (run 'restore' after the device call)"
    ;;
  restore)
    git reset -q -- "${RUNS[@]}"
    for f in "${RUNS[@]}"; do sed -i "\\#^/$f\$#d" "$EXCL"; done
    git status --short -- "${RUNS[@]}"
    ;;
  *)
    echo "usage: carry_triton.sh build VERSION | hide | restore" >&2; exit 2 ;;
esac
