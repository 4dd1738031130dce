# session 22, call C (stage b): the GPU suite's second half with the qkv GEMV + rotary on by default; bench step
# 1B / 8B with it on and off (GRAPHPOOL_KERNELS_OFF=gemv_rope) and the 1B bs 1 profile (kernel count)
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) > $OUT/env-2.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $D/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-2.log | head -5 | cut -c1-250
for s in gemv_rope ""; do timeout 50 env GRAPHPOOL_KERNELS_OFF=$s python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-${s:-def} > $D/step-1b-${s:-def}.log 2>&1; echo "step 1b off=${s:-none} rc=$?: $(grep -E '^\| (1|8|64|128) \|' $D/step-1b-${s:-def}.log | head -4 | cut -d'|' -f2,4,7,9 | tr '\n' ';')"; done
for s in gemv_rope ""; do timeout 70 env GRAPHPOOL_KERNELS_OFF=$s python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-${s:-def} > $D/step-8b-${s:-def}.log 2>&1; echo "step 8b off=${s:-none} rc=$?: $(grep -E '^\| (1|8|64) \|' $D/step-8b-${s:-def}.log | head -3 | cut -d'|' -f2,4,7,9 | tr '\n' ';')"; done
timeout 60 python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b > $D/profile-1b.log 2>&1; echo "profile rc=$?"; grep -E "kernels per step" $D/profile-1b.log | head -3 | cut -c1-160
tar -czf $OUT/callc.tgz -C $OUT d && rm -rf $D
