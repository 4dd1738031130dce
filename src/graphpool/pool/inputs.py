"""The pool's static inputs: what a step passes in (InputSpec), checked, then copied into fixed buffers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

Batch = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class InputSpec:
    """A batch-first static input: each step passes a tensor ``[bs, *trailing_shape]`` of ``dtype``; rows
    added by padding take ``pad_value``."""

    name: str
    trailing_shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.int64
    pad_value: float | int | bool = 0


class StaticInputs:
    """Per microbatch, one pad-filled ``[max_rows, *trailing]`` buffer per spec: the tensors every graph reads.

    ``check`` validates a step's inputs (also when graphs are off); ``allocate`` makes the buffers once.
    """

    def __init__(self, specs: Iterable[InputSpec], num_microbatches: int, device: torch.device | str) -> None:
        self.specs = tuple(specs)
        if not self.specs:
            raise ValueError("GraphPool needs at least one InputSpec")
        if len({s.name for s in self.specs}) != len(self.specs):
            raise ValueError(f"InputSpec names must be distinct: {[s.name for s in self.specs]}")
        self.num_microbatches = num_microbatches
        self.device = torch.device(device)
        self.buffers: list[dict[str, torch.Tensor]] = []

    def allocate(self, max_rows: int) -> None:
        # NOTE: normal tensors even under inference_mode, so run() may copy into them in or out of it.
        with torch.inference_mode(False):
            self.buffers = [
                {
                    s.name: torch.full((max_rows, *s.trailing_shape), s.pad_value, dtype=s.dtype, device=self.device)
                    for s in self.specs
                }
                for _ in range(self.num_microbatches)
            ]

    def free(self) -> None:
        self.buffers = []

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
        for static, mb, r in zip(self.buffers, mbs, rows, strict=True):
            for s in self.specs:
                buf = static[s.name]
                if r:
                    buf[:r].copy_(mb[s.name], non_blocking=True)
                if r < size:
                    buf[r:size].fill_(s.pad_value)

    def pad(self, size: int) -> None:
        """Fill rows ``[0, size)`` of every buffer with pad values (a warm-up's all-padding batch)."""
        for static in self.buffers:
            for s in self.specs:
                static[s.name][:size].fill_(s.pad_value)

    def views(self, size: int) -> list[dict[str, torch.Tensor]]:
        """The first ``size`` rows of every buffer: what a graph of ``size`` is captured on."""
        return [{s.name: static[s.name][:size] for s in self.specs} for static in self.buffers]
