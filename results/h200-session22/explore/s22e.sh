# session 22, call E (stage a): the GPU suite's first half with the decode step's argmax in its graph
# (step_argmax, on by default) and the qkv GEMV + rotary on by default; bench profile of the engine's step
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, triton, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])") > $OUT/env-1.txt; cat $OUT/env-1.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 330 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-1.log | head -5 | cut -c1-250; grep "\[report\].*\(flips\)" $D/gpu-tests-1.log | cut -c1-150
for s in step_argmax ""; do timeout 60 env GRAPHPOOL_KERNELS_OFF=$s python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b-${s:-def} > $D/profile-1b-${s:-def}.log 2>&1; echo "profile off=${s:-none} rc=$?: $(grep -E 'kernels per step|device time per step' $D/profile-1b-${s:-def}.log | head -2 | cut -c1-120 | tr '\n' ' ')"; grep -i "argmax" $D/profile-1b-${s:-def}.log | head -2 | cut -c1-150; done
tar -czf $OUT/calle.tgz -C $OUT d && rm -rf $D
