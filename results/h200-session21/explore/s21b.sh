# session 21, call 2: few-row kernel with split K / one-shot tiles; the GEMV with 8 warps at wide K; cuBLASLt
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GRAPHPOOL_TEST_REPORT=$OUT/report.jsonl
D=$OUT/d; mkdir -p $D; X=results/h200-session21/explore
S() { awk '/^# .*batch size/{match($0,/batch size [0-9]+/); printf "\nrows %s:", substr($0,RSTART+11,RLENGTH-11); next} /^llama/{printf " %s/%s %s", substr($1,7), $2, $5}' $1; echo; }
t0=$(date +%s); timeout 100 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_kernels_skinny_gpu.py -k "chain or float64" > $D/gpu-tests-skinny.log 2>&1; echo "skinny tests (default tiles) rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $D/gpu-tests-skinny.log)"
T="16 256 4 4 0;16 256 4 3 528;32 256 4 3 528;64 256 4 3 528;64 128 4 4 1056;16 2048 4 1 0;16 1024 4 1 528;32 512 4 2 528;64 512 4 2 528;64 512 8 2 528;32 256 4 3 1056;64 256 4 3 264"
t0=$(date +%s); timeout 200 python3 $X/skinny_tiles.py "$T" 2 8 16 64 -- --reps 20 > $D/tiles.log 2>&1; echo "tiles rc=$? $(( $(date +%s) - t0 )) s"; S $D/tiles.log
timeout 60 env TORCH_BLAS_PREFER_CUBLASLT=1 python3 $X/skinny_tiles.py "" 2 8 16 64 -- --reps 20 > $D/cublaslt.log 2>&1; echo "cublasLt rc=$?"; S $D/cublaslt.log
for w in "4 99999" "8 4096" "8 8192"; do timeout 60 python3 $X/gemv_warps.py $w gemm --reps 30 > $D/gemv-warps-${w// /_}.log 2>&1; echo "gemv warps/min_k $w rc=$?: $(grep -E '^llama' $D/gemv-warps-${w// /_}.log | awk '{printf "%s %s  ", $1, $5}')"; done
for e in "" TORCH_BLAS_PREFER_CUBLASLT=1; do timeout 60 env $e python3 -m graphpool.cli bench step --models llama3.2-1b --batch-sizes 2 8 16 64 --no-compile --out $D/step-1b-${e:+lt} > $D/step-1b-${e:+lt}.log 2>&1; echo "step 1b ${e:-def} rc=$?"; grep -E "^\| (1|2|4|8|16|32|64) \|" $D/step-1b-${e:+lt}.log | head -4 | cut -d'|' -f2,4,7,9 | tr '\n' ';'; echo; done
tar -czf $OUT/call2.tgz -C $OUT d && rm -rf $D
