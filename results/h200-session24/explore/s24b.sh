# session 24, call B (stage a, commit 9fbf859: bench/attention_kernel.paged_inputs): the GPU suite's first half;
# bench attention_kernel (its bench_one now builds inputs through paged_inputs) and session 23's call-F script
# (now through paged_inputs too) to show both run and give session 23's figures.
# Usage (device): source .carry/on-device.sh a && bash results/h200-session24/explore/s24b.sh
export GRAPHPOOL_TEST_REPORT=$OUT/report-1.jsonl
D=$OUT/d; mkdir -p $D
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton, transformers, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])") > $D/env.txt; cat $D/env.txt
P2="test_real_model_gpu test_server_gpu test_server_lifecycle_gpu test_prefix_chunked_gpu test_prefill_fast_gpu test_graph_prefill_gpu test_async_scheduling_gpu"
ign=""; for t in $P2; do ign="$ign --ignore=tests/gpu/$t.py"; done
t0=$(date +%s); timeout 330 python3 -m pytest -q -rs -s -p no:cacheprovider tests/gpu $ign > $D/gpu-tests-1.log 2>&1; echo "gpu tests 1 rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-1.log)"; grep -E "^FAILED|^ERROR|^SKIPPED" $D/gpu-tests-1.log | head -8 | cut -c1-200
t0=$(date +%s); timeout 60 python3 -m graphpool.bench.attention_kernel --shapes llama3.2-1b llama3-8b --batch-sizes 1 64 --lens 1024 --ref > $D/attention_kernel.log 2>&1; echo "attention_kernel rc=$? $(( $(date +%s) - t0 )) s"; cat $D/attention_kernel.log | cut -c1-140
t0=$(date +%s); timeout 120 python3 results/h200-session23/explore/attn_depth_mid.py > $D/attn_depth_mid.log 2>&1; echo "attn_depth_mid rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^llama3.2-1b 512 (9|64) |^llama3-8b rand (16|24) |Error" $D/attn_depth_mid.log
tar -czf $OUT/callb.tgz -C $OUT d && rm -rf $D
