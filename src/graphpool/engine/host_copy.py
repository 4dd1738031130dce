"""Host values on the device without waiting for the stream: through pinned memory on CUDA, since a plain
(pageable) copy waits for the work already queued (under async scheduling: the decode step in flight).

`HostStaging` is the per-step path: a step's small arrays (tokens, positions, slots, lengths, block tables,
sampling parameters) packed into one reused pinned buffer and sent in one copy, where `to_device` costs a pinned
allocation and a copy per list."""

from __future__ import annotations

import numpy as np
import torch

from graphpool.pool.pinned import PinnedBuffer

_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32}
ALIGN = 8  # bytes: every array starts where its dtype can be viewed
NUM_BUFFERS = 8  # pinned buffers used in turn: more than the copies of one step (a chunked prefill's few)
MIN_BYTES = 4096


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pin = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pin).to(device, non_blocking=pin)


class HostStaging:
    """Host arrays -> device tensors (same dtypes and shapes) in one copy, through pinned buffers used in turn.

    A buffer is written again only once the copy out of it has run; one whose copy is still queued is replaced,
    not waited for (`pool.pinned.PinnedBuffer`), so staging never holds the host behind the GPU. Off CUDA the
    tensors are a fresh copy."""

    def __init__(self, device: torch.device, num_buffers: int = NUM_BUFFERS) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        self._buffers: list[PinnedBuffer | None] = [None] * num_buffers
        self._turn = 0

    def to_device(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """int64, int32 or float32 arrays (any shape and strides) -> device tensors of their dtypes and shapes:
        views of one device tensor, valid as long as the caller keeps them."""
        for a in arrays:
            if a.dtype not in _DTYPES:
                raise TypeError(f"HostStaging takes int64, int32 or float32 arrays, got {a.dtype}")
        spans = [-(-a.nbytes // ALIGN) * ALIGN for a in arrays]
        total = sum(spans)
        self._turn = (self._turn + 1) % len(self._buffers)
        buf = self._buffers[self._turn]
        if buf is None or buf.bytes.numel() < total or buf.busy():
            grown = 2 * buf.bytes.numel() if buf is not None else 0
            buf = self._buffers[self._turn] = PinnedBuffer(max(total, grown, MIN_BYTES), self.pin)
        host = buf.bytes.numpy()
        off = 0
        for a, span in zip(arrays, spans, strict=True):
            host[off:off + a.nbytes].view(a.dtype).reshape(a.shape)[...] = a
            off += span
        if self.pin:
            dev = buf.bytes[:total].to(self.device, non_blocking=True)
            buf.sent(self.device)
        else:
            dev = buf.bytes[:total].clone()
        out, off = [], 0
        for a, span in zip(arrays, spans, strict=True):
            out.append(dev[off:off + a.nbytes].view(_DTYPES[a.dtype]).view(a.shape))
            off += span
        return out
