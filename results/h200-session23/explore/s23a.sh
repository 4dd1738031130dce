# session 23, call A (stage a): GPU suite part 1 on HEAD (split_loop staged, merge module, argmax in graph); attention tiles + split loop
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, triton, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])") > $OUT/env-1.txt; cat $OUT/env-1.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 340 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-1.log | head -8 | cut -c1-250
t0=$(date +%s); timeout 170 python3 .carry/x/attn_tiles.py > $D/attn_tiles.log 2>&1; echo "attn_tiles rc=$? $(( $(date +%s) - t0 )) s"; cat $D/attn_tiles.log | cut -c1-160
tar -czf $OUT/calla.tgz -C $OUT d && rm -rf $D
