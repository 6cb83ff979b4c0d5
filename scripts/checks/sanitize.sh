#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over scripts/checks/sanitize.py: one small call of
# every kernel variant, each checked against its reference (target, docs/design.md, "The bar":
# memcheck, racecheck and synccheck clean on one run of each kernel variant).
#
#   OUT=/some/dir bash scripts/checks/sanitize.sh          # or: bash scripts/checks/sanitize.sh --out DIR
#
# Steps: (1) warm the Triton cache by running the driver WITHOUT the sanitizer, split over
# WARMUP_SHARDS parallel processes (Triton/Gluon compile in-process on first launch; compiled
# under a sanitizer that would be slow and is not what we check); (2) each tool in turn over the
# whole driver with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor its own cudaMalloc, so memcheck
# sees exact allocation bounds instead of the caching allocator's large segments); (3) one
# verdict line per tool (errors from "ERROR SUMMARY: N errors" / "RACECHECK SUMMARY", the
# driver's own pass/fail count, CUDA API errors, the cases the reports were printed next to).
# Exit status 0 only if every tool passed; 2 if there is no compute-sanitizer or no GPU.
#
# Files (few: the device tool brings back at most 8): $OUT/sanitize/{summary.txt, warmup.log,
# memcheck.log, racecheck.log, synccheck.log}; each tool log holds the driver's case lines and
# the sanitizer reports interleaved.
#
# Environment:
#   TOOLS             tools to run, in order (default "memcheck racecheck synccheck"; initcheck works too)
#   SANITIZE_ONLY / SANITIZE_SKIP   regex over case names (python scripts/checks/sanitize.py --list)
#   SANITIZE_BUDGET   seconds for the whole script (default 540; tools that would start with
#                     < 30 s left are reported "not run"); TOOL_LIMIT max seconds per tool (300)
#   WARMUP_LIMIT (240) / WARMUP_SHARDS (8)  / SKIP_WARMUP=1 (cache already warm)
#   PARALLEL=1        run the tools concurrently (one sanitizer process each) instead of in turn
#   RACECHECK_STRICT=1  racecheck warnings fail too (default: errors only; warnings are shown)
#   CASE_TIMEOUT      driver watchdog per case under a sanitizer (default 180 s)
#   COMPUTE_SANITIZER path to the binary (default: PATH, /usr/local/cuda*/bin, pip nvidia wheels)
#   SANITIZER_ARGS    extra options for every tool; PYTHON (default python); TRITON_CACHE_DIR
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2;;
    --out=*) OUT=${1#--out=}; shift;;
    -h|--help) sed -n '2,31p' "$SELF"; exit 0;;
    *) echo "sanitize.sh: unknown argument $1" >&2; exit 2;;
  esac
done
OUT=${OUT:?set OUT (or --out DIR) to the output directory}
LOG="$OUT/sanitize"
mkdir -p "$LOG"
PY=${PYTHON:-python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1  # driver lines interleave with the sanitizer's reports in order
unset TRITON_INTERPRET
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
TOOLS=${TOOLS:-memcheck racecheck synccheck}
BUDGET=${SANITIZE_BUDGET:-540}
TOOL_LIMIT=${TOOL_LIMIT:-300}
CASE_TIMEOUT=${CASE_TIMEOUT:-180}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
say() { echo "$*"; echo "$*" >> "$SUMMARY"; }

find_cs() {
  if [ -n "${COMPUTE_SANITIZER:-}" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
  local p
  for p in $(ls -d /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
             /opt/nvidia/*/compute-sanitizer 2>/dev/null | sort -rV); do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  "$PY" - <<'PYEOF' 2>/dev/null  # pip wheels (nvidia-cuda-sanitizer-api) ship the binary too
import glob, os, site, sys
dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
for d in dirs:
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "**", "compute-sanitizer"), recursive=True)):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            print(p); sys.exit(0)
PYEOF
}
CS=$(find_cs)
if [ -z "$CS" ] || [ ! -x "$CS" ]; then
  say "sanitize: FAIL compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"
  exit 2
fi
say "=== sanitize ($(date -u +%FT%TZ)): $CS ($("$CS" --version 2>&1 | grep -i -m1 version))"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "sanitize: FAIL no CUDA device visible to torch"
  exit 2
fi
DRIVER_ARGS=(--case-timeout "$CASE_TIMEOUT")
[ -n "${SANITIZE_ONLY:-}" ] && DRIVER_ARGS+=(--only "$SANITIZE_ONLY")
[ -n "${SANITIZE_SKIP:-}" ] && DRIVER_ARGS+=(--skip "$SANITIZE_SKIP")

# ---- 1. warm-up (no sanitizer): compile every kernel into TRITON_CACHE_DIR, sharded
if [ -z "${SKIP_WARMUP:-}" ]; then
  NSH=${WARMUP_SHARDS:-8}
  WTMP=$(mktemp -d)
  pids=()
  for i in $(seq 0 $((NSH - 1))); do
    timeout -k 10 "${WARMUP_LIMIT:-240}" "$PY" scripts/checks/sanitize.py "${DRIVER_ARGS[@]}" --shard "$i/$NSH" \
        > "$WTMP/w$i.log" 2>&1 &
    pids+=($!)
  done
  wrc=0
  for p in "${pids[@]}"; do wait "$p" || wrc=$?; done
  cat "$WTMP"/w*.log > "$LOG/warmup.log"
  rm -rf "$WTMP"
  nok=$(grep -c '^\[.*\] ok ' "$LOG/warmup.log"); nfail=$(grep -c '^\[.*\] FAIL ' "$LOG/warmup.log")
  nskip=$(grep -c '^\[.*\] skip ' "$LOG/warmup.log")
  say "warm-up  : $nok ok, $nfail failed, $nskip skipped without sanitizer in $(elapsed) s (${NSH} shards; last nonzero exit $wrc)"
  [ "$nfail" -gt 0 ] && grep '^\[.*\] FAIL ' "$LOG/warmup.log" | head -10 | tee -a "$SUMMARY"
fi

# ---- 2. the tools
HELP=$("$CS" --help 2>&1)
has_opt() { printf '%s' "$HELP" | grep -q -- "$1"; }
tool_opts() {  # options per tool (only those this compute-sanitizer version knows)
  local t=$1 o=(--tool "$t")
  has_opt "--target-processes" && o+=(--target-processes all)
  has_opt "--print-limit" && o+=(--print-limit 200)
  has_opt "--show-backtrace" && o+=(--show-backtrace device)  # host frames of python say nothing
  case "$t" in
    memcheck)
      # bytes of padding after every allocation: an access just past a tensor faults instead
      # of landing in a neighbouring allocation
      has_opt "--padding" && o+=(--padding 64);;
  esac
  printf '%s\n' "${o[@]}"
}
run_tool() {  # run_tool TOOL LIMIT -> writes $LOG/TOOL.log and $LOG/.TOOL.status
  local t=$1 limit=$2 start rc
  start=$(date +%s)
  mapfile -t opts < <(tool_opts "$t")
  echo "# $CS ${opts[*]} ${SANITIZER_ARGS:-} $PY scripts/checks/sanitize.py ${DRIVER_ARGS[*]}" > "$LOG/$t.log"
  # shellcheck disable=SC2086
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 15 "$limit" "$CS" "${opts[@]}" ${SANITIZER_ARGS:-} \
      "$PY" scripts/checks/sanitize.py "${DRIVER_ARGS[@]}" >> "$LOG/$t.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start ))" > "$LOG/.$t.status"
}
verdict() {  # verdict TOOL -> appends the line, returns 0 pass / 1 fail
  local t=$1 rc secs line st
  read -r rc secs < "$LOG/.$t.status"
  rm -f "$LOG/.$t.status"
  st=()
  [ -n "${RACECHECK_STRICT:-}" ] && [ "$t" = racecheck ] && st=(--strict-warnings)
  local v
  line=$("$PY" scripts/checks/sanitize.py --summarize "$LOG/$t.log" --tool "$t" --rc "$rc" --seconds "$secs" ${st[@]+"${st[@]}"})
  v=$?
  say "$line"
  return $v
}

fail=0
ran=()
if [ -n "${PARALLEL:-}" ]; then
  left=$(( BUDGET - $(elapsed) - 10 ))
  limit=$(( left < TOOL_LIMIT ? left : TOOL_LIMIT ))
  pids=()
  for t in $TOOLS; do run_tool "$t" "$limit" & pids+=($!); ran+=("$t"); done
  for p in "${pids[@]}"; do wait "$p"; done
else
  for t in $TOOLS; do
    left=$(( BUDGET - $(elapsed) - 10 ))
    if [ "$left" -lt 30 ]; then
      say "$(printf '%-9s' "$t"): NOT RUN (budget SANITIZE_BUDGET=$BUDGET s spent; rerun with TOOLS=$t)"
      fail=1
      continue
    fi
    limit=$(( left < TOOL_LIMIT ? left : TOOL_LIMIT ))
    echo "--- $t (limit $limit s, t=$(elapsed) s)"
    run_tool "$t" "$limit"
    ran+=("$t")
    verdict "$t" || fail=1
  done
fi
if [ -n "${PARALLEL:-}" ]; then
  for t in "${ran[@]}"; do verdict "$t" || fail=1; done
fi
say "sanitize : $([ $fail = 0 ] && echo PASS || echo FAIL) after $(elapsed) s; logs in $LOG"
exit $fail
