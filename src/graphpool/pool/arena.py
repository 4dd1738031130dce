"""The arena layout's shared memory: one MemPool that every graph's warm-up and capture allocate from, and
output aliases that let a graph's outputs go back to it.

Graphs replay one at a time on one stream, so what one graph allocates while it runs (activations, the
logits) can be what the next one allocates: a capture into the arena reuses the blocks the earlier captures
freed, as vLLM, SGLang and TensorRT-LLM capture into one pool, largest size first. A graph's outputs would
pin their blocks for as long as the graph lives, so they are swapped for aliases that do not own their
memory (the allocator sees the block free and hands it to the next capture): a replay still writes them,
and they hold what the last replay wrote until another graph of the arena runs. A graph then holds nothing
of its own in the arena. Its instantiated executable (the kernels' parameters) lives in a heap the driver
keeps for the process and reuses for the next executables, so evicting a graph gives no device memory back
and capturing another takes none: that heap is the process's, as the capture stream's workspaces are.

Every alias keeps the arena's ``Lease`` alive, and the capturer gives a retired arena's memory back only
once its lease is gone: an output held past the arena's last graph stays readable, as a per-graph pool's
outputs do.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


class Lease:
    """Held by every output alias of an arena's graphs (and by the arena itself)."""

    __slots__ = ("__weakref__",)


class _Span:
    """A byte range of device memory in the CUDA array interface; the alias's storage holds it (and so the
    lease) until the storage dies."""

    __slots__ = ("__cuda_array_interface__", "lease")

    def __init__(self, ptr: int, nbytes: int, lease: Lease) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}
        self.lease = lease


def alias(t: torch.Tensor, lease: Lease) -> torch.Tensor:
    """A tensor over ``t``'s memory (same shape, strides, dtype) that does not own it."""
    if t.numel() == 0:
        return t
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    raw = torch.as_tensor(_Span(t.data_ptr(), span * t.element_size(), lease), device=t.device)
    out = raw.view(t.dtype).as_strided(t.shape, t.stride())
    if out.data_ptr() != t.data_ptr():  # NOTE: as_tensor copies across devices; an alias must never be a copy
        raise RuntimeError(f"output alias at {out.data_ptr():#x} is not the output at {t.data_ptr():#x}")
    return out


def alias_outputs(outputs: Any, lease: Lease) -> Any:
    """``outputs`` (a tensor, or nested tuples/lists of tensors) with every tensor replaced by its alias."""
    if isinstance(outputs, torch.Tensor):
        return alias(outputs, lease)
    if isinstance(outputs, tuple | list):
        return type(outputs)(alias_outputs(o, lease) for o in outputs)
    return outputs


def output_bytes(outputs: Any) -> int:
    """Bytes of the tensors in ``outputs`` (a tensor, or nested tuples/lists of tensors)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.numel() * outputs.element_size()
    if isinstance(outputs, tuple | list):
        return sum(output_bytes(o) for o in outputs)
    return 0


@dataclass(eq=False)
class Arena:
    """One shared MemPool and the graphs captured into it."""

    mempool: Any
    lease: Lease | None = field(default_factory=Lease)  # None once retired
    live: int = 0  # graphs captured into it and not released
    nbytes: int = 0  # the caching allocator's growth over every warm-up and capture into it: its segments

    def retire(self) -> Retired:
        """The arena as a retired pool, leased while an output alias lives (the arena itself lets go)."""
        lease = weakref.ref(self.lease) if self.lease is not None else None
        self.lease = None
        return Retired(self.mempool, lease)


@dataclass(eq=False)
class Retired:
    """A MemPool no graph uses any more, kept while its memory may still be read."""

    mempool: Any
    lease: weakref.ref[Lease] | None = None

    def leased(self) -> bool:
        """Whether an output alias still reads this pool's memory."""
        return self.lease is not None and self.lease() is not None
