"""Staged kernels: written and tested on the CPU (Triton interpreter, sm_90 compile) but not yet run by the
project's GPU suite. They stay off until it has passed them; ``GRAPHPOOL_STAGED_KERNELS=1`` turns them on
(their GPU tests do). Staged now: the decode attention's fused merge (the last split of each (sequence, kv
head) merges them: one attention kernel per layer instead of two; `_triton_decode_attention.py`; on the H200
in session 18 it was not bitwise the two kernels at 16 splits and its kernels took 1-6% more time, so it stays
here until `bench step` shows the launches it saves are worth it), and the sampler's row argmax (two Triton
launches in place of torch's argmax, 38 us at 1B bs 1 on the H200; `kernels/argmax.py`, interpreter test
equal to torch.argmax, GPU test not yet run). Left staging after the H200 suite passed them (session 16): the fused
SwiGLU silu*mul (`kernels/silu_mul.py`) and the varlen prefill attention (`model/attn_ops`).
"""

from __future__ import annotations

import os

STAGED_ENV = "GRAPHPOOL_STAGED_KERNELS"


def staged_kernels_on() -> bool:
    return os.environ.get(STAGED_ENV, "") == "1"
