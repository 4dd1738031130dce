"""Programmatic dependent launch (PDL, sm_90+): whether launches use it, and the trigger the others call.

A kernel launched with PDL may start before the kernel ahead of it in the stream has finished, once every
program of that one has called ``griddepcontrol.launch_dependents`` (or exited); it must call
``griddepcontrol.wait`` before it reads what that kernel wrote. graphpool launches only its one-row GEMVs
(`_triton_gemv`, `_triton_gemv_rope`, `_triton_gemv_swiglu`) that way: they load their first weight tile
before the wait, so the weight stream starts while the norm, attention, SwiGLU or GEMV kernel before them
finishes. Those kernels, the GEMVs included, call the trigger first thing (`pdl_trigger`): without a PDL
launch after them it does nothing. Every launcher takes
the ``pdl`` switch as an argument (on by default); the interpreter has no griddepcontrol, so it is never on
there.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents


@functools.cache
def _sm90_or_later(index: int) -> bool:
    # NOTE: a ROCm build reports its gfx9 GPUs as capability 9.x too; griddepcontrol is NVIDIA PTX
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def pdl_on(device: torch.device, enabled: bool = True) -> bool:
    """Whether launches on `device` use PDL: `enabled` (the ``pdl`` switch), a Hopper or later GPU
    (griddepcontrol is sm_90 PTX), not the interpreter. Host-side facts only: capturable."""
    if not enabled or device.type != "cuda" or triton.knobs.runtime.interpret:
        return False
    return _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def pdl_trigger(ON: tl.constexpr):
    """Let a PDL-launched kernel after this one start (call first thing; compiled out when ON is False)."""
    if ON:
        gdc_launch_dependents()
