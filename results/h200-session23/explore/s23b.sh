# session 23, call B (stage b): GPU suite part 2; bench kernels A (issue-12 switches off) vs B (defaults), interleaved
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
D=$OUT/d; mkdir -p $D
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 290 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $D/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-2.log | head -8 | cut -c1-250
t0=$(date +%s); timeout 270 python3 -m graphpool.cli bench kernels --models llama3.2-1b llama3-8b --batch-sizes 1 8 64 128 --engine-sizes 1 8 --out $D/kernels-ab > $D/kernels-ab.log 2>&1; echo "bench kernels rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^(## |\| (1|8|64|128) \|)' $D/kernels-ab.log | cut -c1-130
tar -czf $OUT/callb.tgz -C $OUT d && rm -rf $D
