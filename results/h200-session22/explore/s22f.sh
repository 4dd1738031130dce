# session 22, call F (stage b): the GPU suite's second half; bench step 1B with the step's argmax off / on
# (GRAPHPOOL_KERNELS_OFF=step_argmax), 8B with the defaults
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) > $OUT/env-2.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $D/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-2.log | head -5 | cut -c1-250
for s in step_argmax ""; do timeout 60 env GRAPHPOOL_KERNELS_OFF=$s python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-${s:-def} > $D/step-1b-${s:-def}.log 2>&1; echo "step 1b off=${s:-none} rc=$?"; grep -E '^\| (1|8|64|128) \|' $D/step-1b-${s:-def}.log | cut -c1-90; done
timeout 80 python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-def > $D/step-8b-def.log 2>&1; echo "step 8b rc=$?"; grep -E '^\| (1|8|64) \|' $D/step-8b-def.log | cut -c1-90
tar -czf $OUT/callf.tgz -C $OUT d && rm -rf $D
