# session 24, call C (stage b, right after call B, commit 9fbf859): the GPU suite's second half (server, real model)
# Usage (device): source .carry/on-device.sh b && bash results/h200-session24/explore/s24c.sh
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
D=$OUT/d; mkdir -p $D
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $D/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR|^SKIPPED" $D/gpu-tests-2.log | head -8 | cut -c1-200
tar -czf $OUT/callc.tgz -C $OUT d && rm -rf $D
