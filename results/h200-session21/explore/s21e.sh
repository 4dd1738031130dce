# session 21, call 5 (stage a): the GPU suite's first half with the qkv GEMV + rotary + KV write on (the default),
# bench step 1B with it off then on, 8B bs 1/8/64, bench profile 1B bs 1 (the final kernel list)
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, triton, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])")  > $OUT/env-1.txt; cat $OUT/env-1.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 270 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-1.log | head -5 | cut -c1-250; grep "\[report\].*\(rope\|flips\)" $D/gpu-tests-1.log | cut -c1-150
for o in gemv_rope ""; do timeout 50 env GRAPHPOOL_KERNELS_OFF=$o python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-off-${o:-none} > $D/step-1b-off-${o:-none}.log 2>&1; echo "step 1b off=${o:-none} rc=$?: $(grep -E '^\| (1|8|64|128) \|' $D/step-1b-off-${o:-none}.log | head -4 | cut -d'|' -f2,4,7,9 | tr '\n' ';')"; grep -E "^\| (1|8|64) \|" $D/step-1b-off-${o:-none}.log | sed -n 5,7p | cut -d'|' -f2,3,4 | tr '\n' ';'; echo; done
timeout 120 python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b > $D/step-8b.log 2>&1; echo "step 8b rc=$?: $(grep -E '^\| (1|8|64) \|' $D/step-8b.log | head -3 | cut -d'|' -f2,4,7,9 | tr '\n' ';')"
timeout 60 python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b > $D/profile-1b.log 2>&1; echo "profile rc=$?"; grep -E "kernels per step|sum of kernel" $D/profile-1b.log | head -3 | cut -c1-160
tar -czf $OUT/call5.tgz -C $OUT d && rm -rf $D
