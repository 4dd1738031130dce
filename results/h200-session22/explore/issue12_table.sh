# For a next GPU window (no carry, ~4 min): issue 12's closing table in one call: every switchable kernel of
# issue 12 off (GRAPHPOOL_KERNELS_OFF=gemv,pdl,gemv_rope,step_argmax: cuBLAS projections, the rotary kernel,
# torch's argmax after the replay; the fused SwiGLU and the add + norm kernel are not switchable) then the
# defaults: bench profile 1B bs 1 (kernel count) and bench step 1B bs 1-128, 8B bs 1-64.
# Usage (device): PYTHONPATH=src bash results/h200-session22/explore/issue12_table.sh
D=$OUT/issue12; mkdir -p $D
# first the in-process A/B (bench kernels, written in session 22): the same comparison, interleaved
timeout 240 python3 -m graphpool.cli bench kernels --models llama3.2-1b llama3-8b --batch-sizes 1 8 64 128 --engine-sizes 1 8 --out $D/kernels-ab > $D/kernels-ab.log 2>&1; echo "bench kernels rc=$?"; grep -E '^\| (1|8|64|128) \|' $D/kernels-ab.log | cut -c1-110
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/env.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $D/env.txt
for off in gemv,pdl,gemv_rope,step_argmax ""; do
  tag=${off:+off}; tag=${tag:-def}
  timeout 60 env GRAPHPOOL_KERNELS_OFF=$off python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b-$tag > $D/profile-1b-$tag.log 2>&1
  echo "profile $tag rc=$?: $(grep -E 'kernels per step|device time per step' $D/profile-1b-$tag.log | cut -c1-100 | tr '\n' ' ')"
  timeout 80 env GRAPHPOOL_KERNELS_OFF=$off python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-$tag > $D/step-1b-$tag.log 2>&1
  echo "step 1b $tag rc=$?"; grep -E '^\| (1|8|64|128) \|' $D/step-1b-$tag.log | cut -c1-90
  timeout 100 env GRAPHPOOL_KERNELS_OFF=$off python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-$tag > $D/step-8b-$tag.log 2>&1
  echo "step 8b $tag rc=$?"; grep -E '^\| (1|8|64) \|' $D/step-8b-$tag.log | cut -c1-90
done
