# session 24, call A (no carry, commit e8e4056 = ab88f43's code): issue 12's closing numbers from one run:
# bench profile 1B bs 1 with every issue-12 switch off vs the defaults (kernel count), bench kernels A/B
# (same switches, 1B and 8B), bench step 1B / 8B with the defaults.
# Usage (device): PYTHONPATH=src bash results/h200-session24/explore/s24a.sh
set -u
D=$OUT/d; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $D/gpu.txt
python3 -c "import torch, triton, sys; print(torch.__version__, torch.version.cuda, triton.__version__, sys.version.split()[0])" >> $D/gpu.txt
cat $D/gpu.txt
OFF=gemv,pdl,gemv_rope,step_argmax,attn_stages
for off in $OFF ""; do
  tag=${off:+off}; tag=${tag:-def}
  t0=$(date +%s); timeout 90 env GRAPHPOOL_KERNELS_OFF=$off python3 -m graphpool.cli bench profile --model random:llama3.2-1b --batch-sizes 1 --prefill-tokens 0 --out $D/profile-1b-$tag > $D/profile-1b-$tag.log 2>&1
  echo "profile $tag rc=$? $(( $(date +%s) - t0 )) s: $(grep -E 'kernels per step|device time per step' $D/profile-1b-$tag.log | cut -c1-100 | tr '\n' ' ')"
done
t0=$(date +%s); timeout 200 python3 -m graphpool.cli bench kernels --models llama3.2-1b llama3-8b --batch-sizes 1 8 64 128 --engine-sizes 1 8 --out $D/kernels-ab > $D/kernels-ab.log 2>&1; echo "bench kernels rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^(## |\| (1|8|64|128) \|)' $D/kernels-ab.log | cut -c1-130
t0=$(date +%s); timeout 100 python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 8 64 128 --no-compile --out $D/step-1b-def > $D/step-1b-def.log 2>&1; echo "step 1b rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^\| (1|8|64|128) \|' $D/step-1b-def.log | cut -c1-110
t0=$(date +%s); timeout 120 python3 -m graphpool.cli bench step --models llama3-8b --batch-sizes 1 8 64 --no-compile --out $D/step-8b-def > $D/step-8b-def.log 2>&1; echo "step 8b rc=$? $(( $(date +%s) - t0 )) s"; grep -E '^\| (1|8|64) \|' $D/step-8b-def.log | cut -c1-110
