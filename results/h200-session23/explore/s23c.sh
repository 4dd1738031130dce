# session 23, call C (after stage b; model joined): GPU suite part 2 (call B overrode PYTHONPATH and lost the wheels);
# bench profile 1B bs1 with the issue-12 switches off vs the defaults (kernel count); bench step 1B/8B defaults
export GRAPHPOOL_TEST_REPORT=$OUT/report-2.jsonl
D=$OUT/d; mkdir -p $D
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
files=""; for t in $P2; do files="$files tests/gpu/$t.py"; done
t0=$(date +%s); timeout 290 python3 -m pytest -q -rs -s -p no:cacheprovider $files > $D/gpu-tests-2.log 2>&1; echo "gpu tests 2 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-2.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-2.log | head -8 | cut -c1-250
for off in gemv,pdl,gemv_rope,step_argmax ""; do
  tag=${off:+off}; tag=${tag:-def}
  timeout 60 env GRAPHPOOL_KERNELS_OFF=$off python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b-$tag > $D/profile-1b-$tag.log 2>&1
  echo "profile $tag rc=$?: $(grep -E 'kernels per step|device time per step' $D/profile-1b-$tag.log | cut -c1-100 | tr '\n' ' ')"
done
timeout 80 python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-def > $D/step-1b-def.log 2>&1; echo "step 1b rc=$?"; grep -E '^\| (1|8|64|128) \|' $D/step-1b-def.log | cut -c1-100
timeout 100 python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-def > $D/step-8b-def.log 2>&1; echo "step 8b rc=$?"; grep -E '^\| (1|8|64) \|' $D/step-8b-def.log | cut -c1-100
tar -czf $OUT/callc.tgz -C $OUT d && rm -rf $D
