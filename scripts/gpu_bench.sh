#!/usr/bin/env bash
# All three benchmarks on one GPU in one call (the lead runs it on the H200 through the device tool):
#   bash scripts/gpu_bench.sh            # writes under $OUT (default ./gpu_bench_out)
# Budget: under 9 minutes in all; each stage has its own time limit so one slow stage cannot eat the rest,
# and each bench rewrites its report as it goes, so a stage cut short still leaves numbers.
# What comes back (<= 8 files): summary.md, log.txt, results.tar.gz (all JSON/Markdown/PNG), and the 3 PNGs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_bench_out}
RES=$(mktemp -d)/results
mkdir -p "$OUT" "$RES"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=$OUT/log.txt
: >"$LOG"
START=$(date +%s)

stage() {  # stage NAME SECONDS ARGS...: one bench in its own process, killed (SIGINT, then KILL) past its limit
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s, $(($(date +%s) - START))s elapsed) ===" | tee -a "$LOG"
  timeout -s INT -k 15 "$limit" "$PY" -m graphpool.bench "$@" --out "$RES/$name" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $(($(date +%s) - START))s ===" | tee -a "$LOG"
}

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  | tee -a "$LOG"

# 1. decode step: 1B and 8B, 9 batch sizes, torch.compile at bs 1 and 32 (~20-60 s of compile each)
stage step 280 step --models llama3.2-1b llama3-8b --compile-sizes 1 32
# 2. graph memory: the whole 46-size ladder of the 1B step, shared vs per_graph, eviction, byte budget
stage memory 75 memory --model llama3.2-1b
# 3. serving trace, quick: two loads (16 and 40 req/s, 5 s each) x seven policies
stage trace 185 trace --quick

"$PY" -m graphpool.bench.summary "$RES" >"$OUT/summary.md" 2>>"$LOG"
tar -czf "$OUT/results.tar.gz" -C "$(dirname "$RES")" results
cp "$RES"/step/step.png "$RES"/memory/memory.png "$RES"/trace/trace_itl_cdf.png "$OUT"/ 2>/dev/null
echo "total $(($(date +%s) - START))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
grep -E "Traceback|Error|error" "$LOG" | tail -n 8
cat "$OUT/summary.md"
