#!/usr/bin/env bash
# The one command the lead runs on the GPU machine:  OUT=/some/dir bash scripts/checks/gpu_check.sh
#
# 1. prints the environment; 2. runs the whole test suite (GPU tests included) into
# $OUT/pytest.log; 3. runs the bench (quantize, deepseek, moe, default test cases), each step
# under its own time limit, saving its run (<gpu>/runs.jsonl + <gpu>/latest/<suite>.md, as in
# benchmarks/results/); 4. prints the markdown summaries to stdout.
# A failing or timed-out step does not stop the next one (a timed-out bench still writes what it
# measured: SIGTERM ends its sweep early). Whole script: about 9 minutes.
# Files left in $OUT (few, because only the latest 8 come back): pytest.log, bench.log,
# summary.md, results.tar.gz (runs.jsonl + latest/*.md + png of every bench step, laid out as
# benchmarks/results/).
#
# BENCH_STEPS picks the bench steps (default "quantize deepseek moe test-cases"; also masked,
# nvfp4-group, dual-gemm, swiglu = fp8_block SwiGLU on the DeepSeek-V3 shapes, families = issue 19's
# broad dense fp8_block set vs DeepGEMM / cuBLAS, families-tuned = the same after bench --tune 6, mx = issue 18's MX/NV
# suite, ~6 min alone; moe-layer and model = issue 20's layer / model suites; set but empty: none).
# Optional steps (off by default; each needs most of a 10-minute device call, so combine them
# with SKIP_PYTEST=1 SKIP_BENCH=1, e.g. `SKIP_PYTEST=1 SKIP_BENCH=1 SANITIZE=1 OUT=... bash scripts/checks/gpu_check.sh`):
#   HOPPER_CHECK=1  scripts/checks/hopper_check.py: the Hopper kernels (dense variants and planner
#                   tiles, grouped, SwiGLU, a CUDA-graph replay) vs the float64 reference
#                   -> $OUT/hopper_check.json (~1-3 min; limit HOPPER_CHECK_LIMIT, default 300 s)
#   COMPILE_TIME=1  scripts/sweeps/compile_time.py: cold / warm start of the DeepSeek-V3 fp8_block path
#                   -> $OUT/compile_time.json (~1-3 min; limit COMPILE_TIME_LIMIT, default 400 s);
#                   COMPILE_TIME_WARMUP=1: bs.warmup of the DeepSeek-V3 layer set incl. one experts module first
#   SANITIZE=1      scripts/checks/sanitize.sh: compute-sanitizer memcheck / racecheck / synccheck over
#                   scripts/checks/sanitize.py -> $OUT/sanitize/ (5 files; budget SANITIZE_BUDGET, default
#                   570 s minus the time already spent; TOOLS=, SANITIZE_ONLY= etc. as documented in
#                   scripts/checks/sanitize.sh)
# They run after pytest and before the bench, in this order (compile time: its own empty Triton cache).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
mkdir -p "$OUT"
PY=${PYTHON:-python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
WORK=$(mktemp -d)
RES="$WORK/results"
mkdir -p "$RES"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

echo "=== environment ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4
"$PY" - <<'PYEOF' 2>&1
import torch, triton, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs", "L2", getattr(p, "L2_cache_size", "?"))
try:
    import deep_gemm; print("deep_gemm", getattr(deep_gemm, "__version__", "?"))
except Exception as e:
    print("deep_gemm: not importable:", type(e).__name__)
PYEOF
git rev-parse --short HEAD 2>/dev/null; git status --porcelain 2>/dev/null | head -5

if [ -z "${SKIP_PYTEST:-}" ]; then
echo "=== pytest (limit ${PYTEST_LIMIT:-200} s) -> pytest.log"
PYT_TIMEOUT=""
"$PY" -c "import pytest_timeout" 2>/dev/null && PYT_TIMEOUT="--timeout 120"
# No -x: one run must show every failure. xdist (on the device image) compiles in parallel.
PYT_XDIST=""
"$PY" -c "import xdist" 2>/dev/null && PYT_XDIST="-n 8"
# Timing tests run alone afterwards: with 8 workers sharing the GPU their timings mean nothing.
timeout -k 10 ${PYTEST_LIMIT:-200} "$PY" -m pytest -q $PYT_XDIST $PYT_TIMEOUT -p no:cacheprovider -m "not timing" ${PYTEST_EXTRA:-} tests > "$OUT/pytest.log" 2>&1
echo "pytest exit $? after $(elapsed) s"; tail -15 "$OUT/pytest.log"
timeout -k 10 120 "$PY" -m pytest -q $PYT_TIMEOUT -p no:cacheprovider -m timing tests >> "$OUT/pytest.log" 2>&1
echo "pytest (timing, serial) exit $? after $(elapsed) s"; tail -5 "$OUT/pytest.log"
fi

if [ -n "${HOPPER_CHECK:-}" ]; then
echo "=== hopper check (limit ${HOPPER_CHECK_LIMIT:-300} s, t=$(elapsed) s) -> hopper_check.json"
timeout -k 10 ${HOPPER_CHECK_LIMIT:-300} "$PY" scripts/checks/hopper_check.py --json "$OUT/hopper_check.json" 2>&1 | tail -60
echo "hopper_check exit ${PIPESTATUS[0]} after $(elapsed) s"
fi
if [ -n "${COMPILE_TIME:-}" ]; then
echo "=== compile time (limit ${COMPILE_TIME_LIMIT:-400} s, t=$(elapsed) s) -> compile_time.json"
timeout -k 10 ${COMPILE_TIME_LIMIT:-400} "$PY" scripts/sweeps/compile_time.py ${COMPILE_TIME_WARMUP:+--warmup} \
    --cold-timeout $(( ${COMPILE_TIME_LIMIT:-400} - 60 )) --out "$OUT/compile_time.json"
echo "compile_time exit $? after $(elapsed) s"
fi
if [ -n "${SANITIZE:-}" ]; then
echo "=== sanitize (t=$(elapsed) s) -> sanitize/"
# default budget: what is left of a 10-minute device call that started with this script
SB=${SANITIZE_BUDGET:-$(( 570 - $(elapsed) ))}; [ "$SB" -lt 120 ] && SB=120
OUT="$OUT" PYTHON="$PY" SANITIZE_BUDGET=$SB bash scripts/checks/sanitize.sh
echo "sanitize exit $? after $(elapsed) s"
fi

bench() {  # bench NAME LIMIT_S ARGS...
  local name=$1 limit=$2; shift 2
  echo "=== bench $name (limit ${limit} s, t=$(elapsed) s)"
  timeout -k 15 "$limit" "$PY" -m blockscaled.bench "$@" --save-results "$RES" \
      --plot "$RES/$name.png" >> "$WORK/bench.log" 2>&1
  echo "bench $name exit $?"
}
# Iterations / warm-up chosen so the whole script fits in ~9 min on an H100.
# Default step limits (quantize, deepseek, moe, test-cases) add up to ~495 s + ~15 s of setup: under
# the 600 s a device command may run (measured at 2cd0f1a with 3 rounds: deepseek 58 s, moe ~45 s).
# The moe suite lists E=8 first, so a sweep cut by its limit still has the DeepSeek-like configs.
[ -n "${SKIP_BENCH:-}" ] && { echo "SKIP_BENCH set: no bench"; exit 0; }
# BENCH_STEPS picks steps (default: quantize deepseek moe test-cases); split them across two
# device calls when the pytest step runs too: each call may take at most 10 minutes.
STEPS=" ${BENCH_STEPS-quantize deepseek moe test-cases} "  # set but empty: no bench
want() { case "$STEPS" in *" $1 "*) return 0;; esac; return 1; }
[ -z "${STEPS// /}" ] && { echo "BENCH_STEPS empty: no bench"; exit 0; }
# (the bench's default --rounds 3: the samples of each case are split into 3 interleaved rounds
# over ours and the baselines, each round with its own warm-up and graph capture)
want quantize && bench quantize 60 --suite quantize --iterations 50
want deepseek && bench deepseek 180 --suite deepseek --deepseek-small-m --iterations 30 --warmup 5
want moe && bench moe 200 --suite moe --iterations 15 --warmup 2
want masked && bench masked 60 --suite masked --iterations 20 --warmup 3
want nvfp4-group && bench nvfp4-group 45 --suite nvfp4-group --iterations 20 --warmup 3
want dual-gemm && bench dual-gemm 45 --suite dual-gemm --iterations 20 --warmup 3
# fp8_block SwiGLU on the DeepSeek-V3 shapes (the Hopper DUAL kernel from M = 128)
want swiglu && bench swiglu 120 --suite deepseek --ops swiglu --formats fp8_block --iterations 20 --warmup 3
want test-cases && bench test-cases 55 --iterations 30 --warmup 5
# issue 19's broad dense set vs DeepGEMM / cuBLAS (115 cases: ~50 s of timing on an H200 after the bench
# fills DeepGEMM's JIT cache in parallel processes, ~55 s; alone: BENCH_STEPS=families SKIP_PYTEST=1)
want families && bench families 300 --suite families --ops gemm --baselines deepgemm,cublas-fp8-block --iterations 15 --warmup 2 --rounds 2
# the same after `--tune 6` (blockscaled.tune on each dense case first: ~30 s of compiles in processes, ~80 s
# of timing on an H100): run families and families-tuned in one call to compare the tuned plans
want families-tuned && bench families-tuned 420 --suite families --ops gemm --baselines deepgemm,cublas-fp8-block --iterations 15 --warmup 2 --rounds 2 --tune 6
# issue 18's MX/NV suite (576 rows; alone it needs most of a device call: BENCH_STEPS=mx SKIP_PYTEST=1)
want mx && bench mx 420 --suite mx --iterations 15 --warmup 2
# issue 20's layer and model suites (DeepSeek-V3's layer makes 22.5 GB of bf16 experts; alone:
# BENCH_STEPS="moe-layer model" SKIP_PYTEST=1)
want moe-layer && bench moe-layer 300 --suite moe-layer --iterations 20 --warmup 3
want model && bench model 240 --suite model --iterations 20 --warmup 3

cp "$WORK/bench.log" "$OUT/bench.log"
# the newest run of each suite: <gpu>/latest/<suite>.md (bench --save-results; the runs
# themselves are lines of <gpu>/runs.jsonl)
: > "$OUT/summary.md"
for f in "$RES"/*/latest/*.md; do
  [ -f "$f" ] || continue
  cat "$f" >> "$OUT/summary.md"; echo >> "$OUT/summary.md"
done
tar -czf "$OUT/results.tar.gz" -C "$RES" . 2>/dev/null
echo "=== summaries (also in \$OUT/summary.md; runs.jsonl/md/png in \$OUT/results.tar.gz)"
cat "$OUT/summary.md"
echo "=== bench log tail"; tail -20 "$OUT/bench.log"
echo "done in $(elapsed) s"
rm -rf "$WORK"
