# session 22, call D (no carry): decode attention split lengths and in-graph argmax (attn_split.py)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
timeout 400 env PYTHONPATH=src python3 results/h200-session22/explore/attn_split.py 2>&1 | tee $OUT/attn_split.log | tail -40
