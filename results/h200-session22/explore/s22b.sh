# session 22, call B (stage a): the engine-workload diagnosis with the qkv GEMV + rotary (both rotating through
# rotate_pair now) off then on, and the GPU suite's first half with it on by default
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch, triton, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])") > $OUT/env-1.txt; cat $OUT/env-1.txt
timeout 150 env PYTHONPATH=src python3 .carry/x/rope_diag_work.py > $D/diag.log 2>&1; echo "diag rc=$?"; tail -4 $D/diag.log | cut -c1-200
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 330 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR" $D/gpu-tests-1.log | head -5 | cut -c1-250; grep "\[report\].*\(rope\|flips\)" $D/gpu-tests-1.log | cut -c1-150
tar -czf $OUT/callb.tgz -C $OUT d && rm -rf $D
