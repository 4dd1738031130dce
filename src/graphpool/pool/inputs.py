"""The pool's static inputs: what a step passes in (InputSpec), checked, then copied into fixed buffers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graphpool.pool.pinned import PinnedBuffer

Batch = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class InputSpec:
    """A batch-first static input: each step passes a tensor ``[bs, *trailing_shape]`` of ``dtype``; rows
    added by padding take ``pad_value``."""

    name: str
    trailing_shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.int64
    pad_value: float | int | bool = 0


ALIGN = 64  # bytes: where each spec's buffer starts in its microbatch's block (any dtype can view it)
HOST_TURNS = 4  # pinned host mirrors used in turn, one a microbatch's write


def _row_bytes(spec: InputSpec) -> int:
    return math.prod(spec.trailing_shape) * torch.empty((), dtype=spec.dtype).element_size()


def _typed(block: torch.Tensor, layout: dict[str, tuple[int, InputSpec]], max_rows: int) -> dict[str, torch.Tensor]:
    """Each spec's ``[max_rows, *trailing]`` buffer: a view of `block` (bytes) at its offset in `layout`."""
    return {name: block[off:off + max_rows * _row_bytes(s)].view(s.dtype).view(max_rows, *s.trailing_shape)
            for name, (off, s) in layout.items()}


class _Mirror(PinnedBuffer):
    """A pinned host copy of one microbatch's block, with its buffers' views."""

    def __init__(self, nbytes: int, layout: dict[str, tuple[int, InputSpec]], max_rows: int, pin: bool) -> None:
        super().__init__(nbytes, pin)
        # NOTE: numpy views where the dtype has one: a numpy slice write costs a fraction of a torch op's dispatch
        self.views: dict[str, Any] = {name: v if v.dtype == torch.bfloat16 else v.numpy()
                                      for name, v in _typed(self.bytes, layout, max_rows).items()}


class StaticInputs:
    """Per microbatch, one pad-filled ``[max_rows, *trailing]`` buffer per spec: the tensors every graph reads,
    views of one block of bytes (the widest rows last, so a bucket's rows of every buffer lie in one span).

    ``check`` validates a step's inputs (also when graphs are off); ``allocate`` makes the buffers once.
    ``write`` copies device inputs buffer by buffer; inputs on the host (``stage_host``: on CUDA) it writes,
    with the bucket's padding, into a pinned mirror of the block and sends in one copy, so a step's host data
    costs one copy instead of a copy and a fill per buffer.
    """

    def __init__(self, specs: Iterable[InputSpec], num_microbatches: int, device: torch.device | str,
                 stage_host: bool | None = None) -> None:
        self.specs = tuple(specs)
        if not self.specs:
            raise ValueError("GraphPool needs at least one InputSpec")
        if len({s.name for s in self.specs}) != len(self.specs):
            raise ValueError(f"InputSpec names must be distinct: {[s.name for s in self.specs]}")
        self.num_microbatches = num_microbatches
        self.device = torch.device(device)
        self.stage_host = self.device.type == "cuda" if stage_host is None else stage_host
        self.buffers: list[dict[str, torch.Tensor]] = []
        self._blocks: list[torch.Tensor] = []
        self._layout: dict[str, tuple[int, InputSpec]] = {}
        self._mirrors: list[_Mirror] = []
        self._turn = 0
        self._max_rows = self._span_start = self._span_row = 0

    def allocate(self, max_rows: int) -> None:
        off = 0
        for s in sorted(self.specs, key=_row_bytes):  # NOTE: stable: equal widths keep the specs' order
            self._layout[s.name] = (off, s)
            off += -(-max_rows * _row_bytes(s) // ALIGN) * ALIGN
        self._max_rows = max_rows
        self._span_start, widest = max(self._layout.values(), key=lambda v: v[0])  # the widest rows' buffer
        self._span_row = _row_bytes(widest)
        # NOTE: normal tensors even under inference_mode, so run() may copy into them in or out of it.
        with torch.inference_mode(False):
            self._blocks = [torch.empty(off, dtype=torch.uint8, device=self.device)
                            for _ in range(self.num_microbatches)]
            self.buffers = [_typed(block, self._layout, max_rows) for block in self._blocks]
        self.pad(max_rows)

    def free(self) -> None:
        self.buffers, self._blocks, self._mirrors = [], [], []

    def check(self, inputs: Batch | Sequence[Batch]) -> tuple[list[Batch], list[int]]:
        """The microbatches of ``inputs`` and their live row counts; ValueError on a wrong count, key or shape."""
        mbs = [inputs] if isinstance(inputs, Mapping) else list(inputs)
        if len(mbs) != self.num_microbatches:
            raise ValueError(f"run() expects {self.num_microbatches} microbatch(es), got {len(mbs)}")
        return mbs, [self._rows(mb) for mb in mbs]

    def _rows(self, mb: Batch) -> int:
        if len(mb) != len(self.specs):
            raise ValueError(f"inputs have keys {sorted(mb)}, expected {[s.name for s in self.specs]}")
        rows = -1
        for s in self.specs:
            t = mb[s.name]
            if rows < 0:
                rows = t.shape[0]
            if t.shape[0] != rows or t.shape[1:] != s.trailing_shape:
                raise ValueError(
                    f"input {s.name!r} has shape {tuple(t.shape)}, expected [{rows}, *{s.trailing_shape}]"
                )
        return rows

    def write(self, mbs: Sequence[Batch], rows: Sequence[int], size: int) -> None:
        """Copy each microbatch into its buffers, padding rows ``[live, size)`` with pad values."""
        for block, static, mb, r in zip(self._blocks, self.buffers, mbs, rows, strict=True):
            on_host = {s.name for s in self.specs if mb[s.name].device.type == "cpu"} if self.stage_host else set()
            if on_host:
                self._send(block, mb, on_host, r, size)
            for s in self.specs:
                if s.name in on_host:
                    continue
                buf = static[s.name]
                if r:
                    buf[:r].copy_(mb[s.name], non_blocking=True)
                if r < size and not on_host:  # NOTE: a staged block carried every buffer's padding
                    buf[r:size].fill_(s.pad_value)

    def _send(self, block: torch.Tensor, mb: Batch, on_host: set[str], r: int, size: int) -> None:
        """The live rows of the `on_host` inputs and every buffer's pad rows into the next mirror, then one copy
        of the block's span that holds rows ``[0, size)`` of every buffer."""
        if not self._mirrors:
            self._mirrors = [self._mirror(block) for _ in range(HOST_TURNS)]
        self._turn = (self._turn + 1) % HOST_TURNS
        mirror = self._mirrors[self._turn]
        if mirror.busy():  # NOTE: replaced, not waited for: torch's pinned allocator keeps it until its copy ran
            mirror = self._mirrors[self._turn] = self._mirror(block)
        for s in self.specs:
            view = mirror.views[s.name]
            if r and s.name in on_host:
                view[:r] = mb[s.name].numpy() if isinstance(view, np.ndarray) else mb[s.name]
            if r < size:
                view[r:size] = s.pad_value
        span = self._span_start + size * self._span_row
        block[:span].copy_(mirror.bytes[:span], non_blocking=True)
        mirror.sent(block.device)

    def _mirror(self, block: torch.Tensor) -> _Mirror:
        return _Mirror(block.numel(), self._layout, self._max_rows, block.is_cuda)

    def on_device(self, mbs: Sequence[Batch]) -> list[Batch]:
        """The microbatches with their host inputs on the pool's device, for an eager step (pinned first where
        the pool stages host inputs, so the copy does not wait for the work already queued)."""
        if not self.stage_host:
            return list(mbs)
        return [{k: t.pin_memory().to(self.device, non_blocking=True) if t.device.type == "cpu" else t
                 for k, t in mb.items()} for mb in mbs]

    def pad(self, size: int) -> None:
        """Fill rows ``[0, size)`` of every buffer with pad values (a warm-up's all-padding batch)."""
        for static in self.buffers:
            for s in self.specs:
                static[s.name][:size].fill_(s.pad_value)

    def views(self, size: int) -> list[dict[str, torch.Tensor]]:
        """The first ``size`` rows of every buffer: what a graph of ``size`` is captured on."""
        return [{s.name: static[s.name][:size] for s in self.specs} for static in self.buffers]
