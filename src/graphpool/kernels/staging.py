"""Staged kernels: written and tested on the CPU (Triton interpreter, sm_90 compile) but not yet run by the
project's GPU suite. They stay off until it has passed them; ``GRAPHPOOL_STAGED_KERNELS=1`` turns them on
(their GPU tests do). Staged now: the decode attention's fused merge (the last split of each (sequence, kv
head) merges them: one attention kernel per layer instead of two; `_triton_decode_attention.py`, interpreter
test bitwise the two kernels, GPU test `test_fused_merge_is_bitwise_the_two_kernels` not yet run). Left staging after the H200 suite passed them (session 16): the fused
SwiGLU silu*mul (`kernels/silu_mul.py`) and the varlen prefill attention (`model/attn_ops`).
"""

from __future__ import annotations

import os

STAGED_ENV = "GRAPHPOOL_STAGED_KERNELS"


def staged_kernels_on() -> bool:
    return os.environ.get(STAGED_ENV, "") == "1"
