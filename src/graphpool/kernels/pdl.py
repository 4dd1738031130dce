"""Programmatic dependent launch (PDL, sm_90+): which launches use it, and the trigger the others call.

A kernel launched with PDL may start before the kernel ahead of it in the stream has finished, once every
program of that one has called ``griddepcontrol.launch_dependents`` (or exited); it must call
``griddepcontrol.wait`` before it reads what that kernel wrote. graphpool launches only its one-row GEMV
(`_triton_gemv`) that way: it loads its first weight tile before the wait, so the weight stream starts
while the norm, attention or SwiGLU kernel before it finishes. Those kernels call the trigger first thing
(`PDL_TRIGGER`): without a PDL launch after them it does nothing. Staged (``GRAPHPOOL_STAGED_KERNELS=pdl``)
until the GPU suite has run with it; the interpreter has no griddepcontrol, so it is never on there.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from graphpool.kernels.staging import staged_kernels_on


def pdl_on() -> bool:
    """Whether launches use PDL now (a host-side fact; a kernel compiled either way is cached by triton)."""
    return staged_kernels_on("pdl") and not triton.knobs.runtime.interpret


@triton.jit
def pdl_trigger(ON: tl.constexpr):
    """Let a PDL-launched kernel after this one start (call first thing; compiled out when ON is False)."""
    if ON:
        gdc_launch_dependents()
