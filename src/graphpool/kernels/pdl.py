"""Programmatic dependent launch (PDL, sm_90+): which launches use it, and the trigger the others call.

A kernel launched with PDL may start before the kernel ahead of it in the stream has finished, once every
program of that one has called ``griddepcontrol.launch_dependents`` (or exited); it must call
``griddepcontrol.wait`` before it reads what that kernel wrote. graphpool launches only its one-row GEMV
(`_triton_gemv`) that way: it loads its first weight tile before the wait, so the weight stream starts
while the norm, attention or SwiGLU kernel before it finishes. Those kernels call the trigger first thing
(`PDL_TRIGGER`): without a PDL launch after them it does nothing. On by default on sm_90+ since the H200 GPU
suite passed with it (session 19); ``GRAPHPOOL_KERNELS_OFF=pdl`` turns it off. The interpreter has no
griddepcontrol, so it is never on there.

Staged (``GRAPHPOOL_STAGED_KERNELS=pdl_chain``; its GPU tests pass, the step is no faster on the H200): the
other kernels of the step (the norms, rotary, the attention split and merge, SwiGLU) launched with PDL too,
each waiting first thing (before it reads or writes anything: a kernel that has not waited may run beside the
one ahead of it, which may still be reading a buffer the allocator has handed on), and the GEMV and rotary
triggering as well; so every kernel's launch overlaps the one ahead of it, not only the GEMV's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from graphpool.kernels.staging import kernel_on, staged_kernels_on


@functools.cache
def _sm90_or_later(index: int) -> bool:
    # NOTE: a ROCm build reports its gfx9 GPUs as capability 9.x too; griddepcontrol is NVIDIA PTX
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def pdl_on(device: torch.device) -> bool:
    """Whether launches on `device` use PDL: a Hopper or later GPU (griddepcontrol is sm_90 PTX), not the
    interpreter, not switched off (``GRAPHPOOL_KERNELS_OFF=pdl``). Host-side facts only: capturable."""
    if device.type != "cuda" or triton.knobs.runtime.interpret or not kernel_on("pdl"):
        return False
    return _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class LaunchFlags:
    pdl: bool  # PDL is on: the GEMV is launched with it, the kernels before a GEMV trigger
    chain: bool  # the staged PDL chain: every kernel launched with PDL, waiting first thing


def launch_flags(device: torch.device) -> LaunchFlags:
    """The PDL flags of a launch on `device` (asked once per launch; see the module's docstring)."""
    pdl = pdl_on(device)
    return LaunchFlags(pdl, pdl and staged_kernels_on("pdl_chain"))


@triton.jit
def pdl_trigger(ON: tl.constexpr):
    """Let a PDL-launched kernel after this one start (call first thing; compiled out when ON is False)."""
    if ON:
        gdc_launch_dependents()


@triton.jit
def pdl_prologue(TRIGGER: tl.constexpr, WAIT: tl.constexpr):
    """A step kernel's first lines: trigger the kernel after it (TRIGGER: `LaunchFlags.pdl`), then, launched
    with PDL itself (WAIT: `LaunchFlags.chain`), wait until the kernel ahead has completed and its writes are
    visible, before any global load or store. Each part compiled out when off."""
    pdl_trigger(TRIGGER)
    if WAIT:
        gdc_wait()
