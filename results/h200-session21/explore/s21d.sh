# session 21, call 4 (stage b, right after call 3): the GPU suite's second half (default model, server)
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log -1 --format='commit %h') > $OUT/env-2.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 330 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $OUT/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR" $OUT/gpu-tests-2.log | head -5 | cut -c1-250
