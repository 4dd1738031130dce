# session 21, call 1: the staged few-row kernel's GPU tests, its tilings in the 16-layer chain, bench step 1B
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D; X=results/h200-session21/explore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"
t0=$(date +%s); timeout 170 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_kernels_skinny_gpu.py > $D/gpu-tests-skinny.log 2>&1; echo "skinny tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-skinny.log)"; grep -E "FAILED|Error|assert" $D/gpu-tests-skinny.log | head -6 | cut -c1-300; grep "\[report\]" $D/gpu-tests-skinny.log | cut -c1-150
T="16 256 4 4;16 512 4 3;16 128 4 6;32 256 4 4;64 128 4 4;16 256 2 4"
t0=$(date +%s); timeout 260 python3 $X/skinny_tiles.py "$T" 2 8 16 64 -- --reps 20 > $D/tiles.log 2>&1; echo "tiles rc=$? $(( $(date +%s) - t0 )) s"; awk '/^# .*batch size/{match($0,/batch size [0-9]+/); printf "\nrows %s:", substr($0,RSTART+11,RLENGTH-11); next} /^llama/{printf " %s/%s %s", substr($1,7), $2, $5}' $D/tiles.log; echo
for s in "" skinny; do timeout 70 env GRAPHPOOL_STAGED_KERNELS=$s python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 1 2 4 8 16 32 64 --no-compile --out $D/step-1b-${s:-def} > $D/step-1b-${s:-def}.log 2>&1; echo "step 1b ${s:-def} rc=$?"; grep -E "^\| (1|2|4|8|16|32|64) \|" $D/step-1b-${s:-def}.log | head -7 | cut -d'|' -f2,4,7,9 | tr '\n' ';'; echo; done
tar -czf $OUT/call1.tgz -C $OUT d && rm -rf $D
