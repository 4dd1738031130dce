#!/usr/bin/env bash
# The step, memory and trace benchmarks on one GPU in one go:
#   bash scripts/gpu_bench.sh            # writes under $OUT (default results/gpu_bench)
# Each stage has its own time limit, cut to what is left before DEADLINE (480 s; SIGINT, then KILL 15 s later),
# so one slow stage cannot eat the rest; each bench rewrites its report as it goes (the trace after every run,
# the step bench after every phase), so a stage cut short keeps its numbers. Order: the predictable stages
# first, the step bench last (its torch.compile column is the slow, variable part, and it runs after both
# models' eager/graph numbers are saved). Typical stage times: docs/benchmarks.md.
# Writes to $OUT: summary.md, log.txt, results.tar.gz (all JSON/Markdown/PNG), and the 3 PNGs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/results/gpu_bench}
RES=$(mktemp -d)/results
mkdir -p "$OUT" "$RES"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=$OUT/log.txt
: >"$LOG"
START=$(date +%s)
DEADLINE=${BENCH_DEADLINE_S:-480}  # seconds for all the stages together

stage() {  # stage NAME SECONDS ARGS...: one bench in its own process, killed (SIGINT, then KILL) past its limit
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - ($(date +%s) - START)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    echo "=== $name: skipped, ${left}s left of ${DEADLINE}s ===" | tee -a "$LOG"
    return
  fi
  echo "=== $name (limit ${limit}s, $(($(date +%s) - START))s elapsed) ===" | tee -a "$LOG"
  timeout -s INT -k 15 "$limit" "$PY" -m graphpool.bench "$@" --out "$RES/$name" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $(($(date +%s) - START))s ===" | tee -a "$LOG"
}

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" \
  | tee -a "$LOG"

# 1. graph memory: the 1B step's ladder, arena vs per_graph: where the bytes go, resident sets, eviction, byte budget
stage memory 60 memory --model llama3.2-1b
# 2. serving trace, default profile: three loads (4, 16, 40 req/s, 8 s each) x seven policies
stage trace 300 trace
# 3. decode step: 1B and 8B, 9 batch sizes; then torch.compile (plain-torch-ops step) at bs 1 and 32
stage step 300 step --models llama3.2-1b llama3-8b --compile-sizes 1 32

"$PY" benchmarks/summary.py "$RES" >"$OUT/summary.md" 2>>"$LOG"
tar -czf "$OUT/results.tar.gz" -C "$(dirname "$RES")" results
cp "$RES"/step/step.png "$RES"/memory/memory.png "$RES"/trace/trace_itl_cdf.png "$OUT"/ 2>/dev/null
echo "total $(($(date +%s) - START))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
grep -E "Traceback|Error|error" "$LOG" | tail -n 8
cat "$OUT/summary.md"
