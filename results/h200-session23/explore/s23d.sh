# session 23, call D (no carry): attn_stages (2 pipeline stages on large attention grids, on by default):
# the GPU suite's first half with it; bench kernels with only it off vs the defaults; the issue-12 A/B (every
# switch off vs the defaults) for the closing table; bench step 1B and 8B with the defaults
# Usage (device): PYTHONPATH=src bash results/h200-session23/explore/s23d.sh
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-1.log | head -8 | cut -c1-250; grep "attention depth" $D/gpu-tests-1.log | cut -c1-200
t0=$(date +%s); timeout 120 python3 -m graphpool.cli bench kernels --off attn_stages --models llama3.2-1b llama3-8b --batch-sizes 1 8 64 128 --engine-sizes 64 --out $D/kernels-stages > $D/kernels-stages.log 2>&1; echo "bench kernels attn_stages rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^(## |\| (1|8|64|128) \|)' $D/kernels-stages.log | cut -c1-130
t0=$(date +%s); timeout 120 python3 -m graphpool.cli bench kernels --models llama3.2-1b llama3-8b --batch-sizes 1 8 64 128 --engine-sizes 1 8 --out $D/kernels-ab > $D/kernels-ab.log 2>&1; echo "bench kernels issue 12 rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^(## |\| (1|8|64|128) \|)' $D/kernels-ab.log | cut -c1-130
timeout 80 python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-def > $D/step-1b-def.log 2>&1; echo "step 1b rc=$?"; grep -E '^\| (1|8|64|128) \|' $D/step-1b-def.log | cut -c1-100
timeout 100 python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-def > $D/step-8b-def.log 2>&1; echo "step 8b rc=$?"; grep -E '^\| (1|8|64) \|' $D/step-8b-def.log | cut -c1-100
tar -czf $OUT/calld.tgz -C $OUT d && rm -rf $D
