# session 22, call A (no carry): the gemv_features refactor's GPU kernel tests, then the engine-test workload
# diagnosis of the staged qkv GEMV + rotary + KV write (rope_diag_work.py)
export GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)") | tee $OUT/env.txt
export PYTHONPATH=src
t0=$(date +%s); timeout 300 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu/test_kernels_gemv_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_kernels_silu_mul_gpu.py > $OUT/kernel-tests.log 2>&1; echo "kernel tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/kernel-tests.log)"; grep -E "^FAILED|^ERROR" $OUT/kernel-tests.log | head -5 | cut -c1-250; grep "\[report\].*\(rope\|flips\)" $OUT/kernel-tests.log | cut -c1-150
timeout 200 python3 results/h200-session21/explore/rope_diag_work.py 2>&1 | tee $OUT/diag.log | tail -12
