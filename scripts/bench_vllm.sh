#!/usr/bin/env bash
# graphpool's default configuration and vLLM 0.26 side by side on one GPU, greedy and sampled, in one call:
#   bash scripts/bench_vllm.sh [MODEL]      # MODEL default random:llama3.2-1b (vLLM: /tmp/vllm-models/<preset>)
# Needs, on the same machine: graphpool's dependencies importable (PYTHONPATH: the staged site of
# shared/device/README.md), vLLM installed in $VK_SITE (shared/device/vllm/README.md) and VLLM_ENV, the path of
# that installer's install.sh, whose `env` mode exports vLLM's variables (offline, no FlashInfer sampler, caches).
# Each server gets its own PYTHONPATH: graphpool's children this shell's (gp-site + src), the vLLM child only
# $VK_SITE; bench serve keeps them apart (--vllm-pythonpath). The whole bench is cut at LIMIT_S (SIGINT, then
# KILL 15 s later); every run is saved as it finishes and the report is rebuilt from what was saved.
# Settings (environment): CONFIGS (default "default full-pool vllm"; a NAME=FLAGS one without spaces, e.g.
# p128=--mixed-prompt-tokens=128), SEEDS (servers started per configuration, in
# turn: 2 gives a first start and a restart), DURATION (s of arrivals per workload), RATE
# (req/s), CONCURRENCY (most requests in flight; 1: single stream), LOADS (several loads against each server
# start, replacing RATE and CONCURRENCY: e.g. "16 2:1", 16 req/s and then a single stream at 2 req/s),
# TEMPERATURES (default "0 0.8"), VLLM_ARGS,
# VLLM_MODEL (vLLM's model folder; needed for any MODEL but random:<preset>, e.g. the embedded default converted
# by shared/device/vllm's gguf2hf.py), STEP_TIMELINE=1 (graphpool keeps its step timeline and every client gap over
# 10 ms, or GAP_MS, is attributed to what ran in it; off by default: the recording adds two events a step), PRECOMPILE=0
# (leaves the packages' bytecode as it is), LIMIT_S, OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-random:llama3.2-1b}
DURATION=${DURATION:-20}
CONFIGS=${CONFIGS:-default full-pool vllm}
TEMPERATURES=${TEMPERATURES:-0 0.8}
RATE=${RATE:-16}
LIMIT_S=${LIMIT_S:-500}
OUT=${OUT:-$PWD/results/serve_vllm}
VLLM_ARGS=${VLLM_ARGS:---gpu-memory-utilization=0.5}  # as in shared/device/vllm/README.md's serve command
VK_SITE=${VK_SITE:-/tmp/vllm-site}

export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
GP_PYTHONPATH=$PYTHONPATH
if [ ! -d "$VK_SITE/vllm" ] || [ ! -f "${VLLM_ENV:-}" ]; then
  echo "bench_vllm.sh: needs vLLM in $VK_SITE and VLLM_ENV=<its install.sh> (shared/device/vllm/README.md)" >&2
  exit 2
fi
# NOTE: the installer's env mode exports vLLM's variables and prepends its site to PYTHONPATH: the variables
# stay, PYTHONPATH goes back to graphpool's (bench serve gives the vLLM child only $VK_SITE)
source "$VLLM_ENV" env
export PYTHONPATH=$GP_PYTHONPATH PYTHONUNBUFFERED=1
# NOTE: both engines' packages as a pip install leaves them, compiled to bytecode: a Python run with
# PYTHONDONTWRITEBYTECODE=1 (as on the GPU machine) otherwise compiles every module it imports at every start,
# in both engines' start-ups; torch, triton and transformers, which both import, are compiled too where they
# lack it. PRECOMPILE=0 skips it.
if [ "${PRECOMPILE:-1}" = 1 ]; then
  T0=$(date +%s)
  SHARED=$(python3 -c "import importlib.util as u; print(*(u.find_spec(m).submodule_search_locations[0] for m in ('torch', 'triton', 'transformers') if u.find_spec(m)))")
  timeout 300 python3 -m compileall -q -j 0 $(echo "$GP_PYTHONPATH" | tr ':' ' ') "$VK_SITE" $SHARED >/dev/null 2>&1
  echo "bytecode: compileall exit $? after $(($(date +%s) - T0)) s"
fi
rm -rf "$OUT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/gpu.txt"

timeline=(--no-step-timeline)
[ "${STEP_TIMELINE:-0}" = 1 ] && timeline=(${GAP_MS:+--gap-threshold-ms "$GAP_MS"})
vllm_args=()
for a in $VLLM_ARGS; do vllm_args+=("--vllm-arg=$a"); done
# NOTE: graphpool first, vLLM last: a server's memory is all back before the next one sizes its KV cache
load=(--rate "$RATE" ${CONCURRENCY:+--concurrency "$CONCURRENCY"})
[ -n "${LOADS:-}" ] && load=(--loads $LOADS)
args=(serve --model "$MODEL" --configs $CONFIGS --temperatures $TEMPERATURES --seeds "${SEEDS:-1}" "${load[@]}"
      ${VLLM_MODEL:+--vllm-model "$VLLM_MODEL"}
      --duration "$DURATION" --prompt-mean 300 --prompt-cap 1024 --max-tokens-mean 128 --max-tokens-cap 384
      "${timeline[@]}" --startup-timeout 300 --vllm-python python3 --vllm-pythonpath "$VK_SITE"
      "${vllm_args[@]}" --out "$OUT")
START=$(date +%s)
timeout -s INT -k 15 "$LIMIT_S" python3 -m graphpool.bench "${args[@]}" >"$OUT/log.txt" 2>&1
echo "bench serve: exit $? after $(($(date +%s) - START)) s (log $OUT/log.txt)"
grep -E "ready|warm-up|errors,|prime|Error|error" "$OUT/log.txt" | grep -v "^|" | tail -n 20
if ls "$OUT"/runs/*.json >/dev/null 2>&1; then
  python3 -m graphpool.bench "${args[@]}" --report-only >/dev/null 2>>"$OUT/log.txt"
  sed -n '/^### Side by side/,$p' "$OUT/serve.md"
  grep -h -E "Graph capturing finished|Capturing CUDA graphs.*100%" "$OUT"/logs/vllm-seed0.log 2>/dev/null \
    | tr '\r' '\n' | grep -E "finished|100%" | tail -n 3
fi
tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "results: $OUT.tar.gz"
