"""Staged kernels: written and tested on the CPU first (Triton interpreter, sm_90 compile), and off until the
project's GPU suite has passed them and the H200's numbers say they pay; ``GRAPHPOOL_STAGED_KERNELS=1`` turns
them all on, ``GRAPHPOOL_STAGED_KERNELS=argmax`` some (their GPU tests call them directly). Staged now: the
decode attention's fused merge (the last split of each (sequence, kv head) merges them: one attention kernel
per layer instead of two; `_triton_decode_attention.py`; on the H200 in session 18 its graph replay was 1-2%
slower than the two kernels': the launches it saves do not pay for its longer kernel), and the sampler's row
argmax (two Triton launches in place of torch's argmax: 3.7 against 38 us of device time at 1B bs 1 on the
H200, but back-to-back calls take 88 us each against torch's 28: the launches' host cost;
`kernels/argmax.py`). Both pass the whole GPU suite with this variable set (session 18). And (session 19; on
the H200 in session 20 their GPU tests pass, and none pays: docs/kernels.md) `pdl_chain`: every Triton kernel
of a decode step launched with programmatic dependent launch, waiting first thing (`kernels/pdl.py`), and
`norm_gemv`: the RMSNorm in front of a one-row projection folded into its GEMV
(`kernels/gemv.fused_norm_linear`), and `silu_gemv`: SwiGLU's silu * mul folded into the down projection's
(`kernels/gemv.fused_silu_linear`). Left staging after the H200 suite passed them (session 16): the fused
SwiGLU silu*mul (`kernels/silu_mul.py`) and the varlen prefill attention (`model/attn_ops`); (session 19) the
one-row GEMV (`kernels/gemv.py`) and programmatic dependent launch (`kernels/pdl.py`), which stay switchable
off (``GRAPHPOOL_KERNELS_OFF=gemv,pdl``) for benchmarks' side-by-side runs; (session 22) the one-row qkv GEMV +
rotary + KV write (`kernels/gemv.fused_linear_rope`, ``GRAPHPOOL_KERNELS_OFF=gemv_rope``; staged in session 21
for 1-2 near-tie argmax flips in the engine test: the two kernels' rotations contracted differently); and the
row argmax inside the decode step, where a graph holds its launches (`kernels/argmax.py`,
``GRAPHPOOL_KERNELS_OFF=step_argmax``; in the sampler it stays staged); (session 23) the decode attention's
shallower pipeline on large grids (`attention_grid.choose_num_stages`, ``GRAPHPOOL_KERNELS_OFF=attn_stages``: a
tuning that leaves the bits as they are). Staged in session 22: `split_loop`, the decode
attention's grid with fewer programs per (sequence, kv head), each looping over every P-th split below its row's
length (`attention_grid.loop_programs`), for the splits past a row's length that the engine's `max_model_len`
bound launches only to exit. On the H200 (session 23) it is bitwise and does not pay: 1B bs 128 60.7 -> 55.0 us
a layer with 512-token rows under bound 4096, but 83.8 -> 93.8 with rows filling the bound and 46.1 -> 48.7 at
bs 64 with rows of 1-1200 tokens.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

STAGED_ENV = "GRAPHPOOL_STAGED_KERNELS"


STAGED = ("fused_merge", "argmax", "pdl_chain", "norm_gemv", "silu_gemv", "split_loop")
# NOTE: out of staging, on by default; listed here so a benchmark (or a user who suspects one) can turn them off
DEFAULT_ON = ("gemv", "pdl", "gemv_rope", "step_argmax", "attn_stages")
OFF_ENV = "GRAPHPOOL_KERNELS_OFF"


def staged_kernels_on(name: str) -> bool:
    """Whether staged kernel `name` (one of STAGED) is on: ``GRAPHPOOL_STAGED_KERNELS=1`` turns on all of
    them, a comma-separated list of names only those (so a benchmark can compare one at a time)."""
    if name not in STAGED:
        raise ValueError(f"unknown staged kernel {name!r}; staged: {', '.join(STAGED)}")
    return os.environ.get(STAGED_ENV, "") == "1" or _named(STAGED_ENV, name)


def kernel_on(name: str) -> bool:
    """Whether default-on kernel `name` (one of DEFAULT_ON) is on: unless ``GRAPHPOOL_KERNELS_OFF`` (a
    comma-separated list of names) names it."""
    if name not in DEFAULT_ON:
        raise ValueError(f"unknown kernel switch {name!r}; switches: {', '.join(DEFAULT_ON)}")
    return not _named(OFF_ENV, name)


def _named(env: str, name: str) -> bool:
    """Whether the comma-separated list in environment variable `env` names `name`."""
    return name in os.environ.get(env, "").split(",")


@contextlib.contextmanager
def switches(env: Mapping[str, str]) -> Iterator[None]:
    """The kernel switches (`OFF_ENV`, `STAGED_ENV`) set to `env` inside, put back as they were after (unset
    stays unset): a benchmark's side-by-side settings in one process."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
