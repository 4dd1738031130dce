"""Test doubles for the pool, usable by any part's CPU tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from graphpool.pool.capture import CapturedGraph
from graphpool.pool.failures import CaptureError, classify

Bytes = int | Callable[[int], int]


def copy_outputs(dst: Any, src: Any) -> None:
    """Copy a step's outputs (a tensor, or a nested tuple/list of tensors) into same-shaped static ones."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
        return
    for d, s in zip(dst, src, strict=True):
        copy_outputs(d, s)


class _FakeArena:
    def __init__(self) -> None:
        self.nbytes = 0
        self.live = 0


class EagerCapturer:
    """A capturer without CUDA: "capture" runs the step twice (warm-up, then the run whose outputs become the
    static outputs); "replay" runs it again and copies the result into those outputs, so replay semantics
    (static inputs in, the same output tensors overwritten) match a real graph's.

    ``footprint``: fake bytes each graph holds alone, a constant or a function of the size.
    ``arena``: fake bytes of the arena a capture of that size needs (0: none). As in the real arena layout,
    graphs captured while another is resident share one arena, as large as the largest need, given back with
    the last graph; a capture that fails seals it (the next capture opens another).
    ``shared_outputs`` (the arena layout's contract): every graph's outputs are row views of one buffer per
    output, so a run of any size overwrites the previous run's outputs; False: each graph keeps its own.
    ``fail_sizes``: sizes whose capture fails with ``error(message)`` as if ``capture_end`` raised it
    (mutable: tests may change it). ``capturing`` is True while the step runs "under capture", so a test
    step can raise only there; both surface as ``CaptureError``, classified as the real capturer does.
    """

    def __init__(
        self,
        footprint: Bytes = 0,
        fail_sizes: Iterable[int] = (),
        error: Callable[[str], BaseException] = torch.OutOfMemoryError,
        seconds: float = 0.0,
        arena: Bytes = 0,
        shared_outputs: bool = True,
    ) -> None:
        self.footprint = footprint
        self.arena = arena
        self.shared_outputs = shared_outputs
        self.fail_sizes = set(fail_sizes)
        self.error = error
        self.seconds = seconds
        self.captured: list[int] = []  # sizes, in capture order
        self.released: list[int] = []
        self.replays = 0
        self.capturing = False
        self.arenas_opened = 0
        self._arena: _FakeArena | None = None
        self._sealed: list[_FakeArena] = []
        self._buffers: dict[int, torch.Tensor] = {}  # output index -> the buffer every graph's rows view

    def arena_bytes(self) -> int:
        return sum(a.nbytes for a in (self._arena, *self._sealed) if a is not None and a.live > 0)

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        fn()  # warm-up, as the real capturer does
        if size in self.fail_sizes:
            self._seal()
            err = self.error(f"EagerCapturer: induced capture failure at size {size}")
            raise CaptureError(classify(err, raised_by_step=False), size, err) from err
        self.capturing = True
        try:
            outputs = fn()
        except Exception as e:
            self._seal()
            raise CaptureError(classify(e, raised_by_step=True), size, e) from e
        finally:
            self.capturing = False
        need = self.arena(size) if callable(self.arena) else self.arena
        arena = None
        if need:
            if self._arena is None:
                self._arena = _FakeArena()
                self.arenas_opened += 1
            arena = self._arena
            arena.nbytes = max(arena.nbytes, need)
            arena.live += 1
        if self.shared_outputs:
            outputs = self._place(outputs)
        nbytes = self.footprint(size) if callable(self.footprint) else self.footprint
        self.captured.append(size)
        return CapturedGraph(size=size, outputs=outputs, footprint=nbytes, seconds=self.seconds, native=fn,
                             arena_bytes=self.arena_bytes(), arena=arena)

    def _seal(self) -> None:
        if self._arena is not None and self._arena.live > 0:
            self._sealed.append(self._arena)
        self._arena = None

    def _place(self, outputs: Any) -> Any:
        """``outputs`` copied into rows of the shared buffers (a real replay writes inference tensors)."""
        with torch.inference_mode():
            return self._place_at(outputs, [0])

    def _place_at(self, out: Any, index: list[int]) -> Any:
        if isinstance(out, tuple | list):
            return type(out)(self._place_at(o, index) for o in out)
        if not isinstance(out, torch.Tensor) or out.dim() == 0:
            return out
        i = index[0]
        index[0] += 1
        buf = self._buffers.get(i)
        if buf is None or buf.shape[1:] != out.shape[1:] or buf.dtype != out.dtype or buf.device != out.device:
            buf = None
        if buf is None or buf.shape[0] < out.shape[0]:
            rows = max(out.shape[0], 0 if buf is None else buf.shape[0])
            buf = self._buffers[i] = torch.empty((rows, *out.shape[1:]), dtype=out.dtype, device=out.device)
        view = buf[: out.shape[0]]
        view.copy_(out)
        return view

    def replay(self, graph: CapturedGraph) -> None:
        self.replays += 1
        fresh = graph.native()
        if self.shared_outputs:
            graph.outputs = self._place(fresh)
            return
        # NOTE: a real replay writes inference-tensor outputs whatever the mode: so must the double.
        with torch.inference_mode():
            copy_outputs(graph.outputs, fresh)

    def release(self, graph: CapturedGraph) -> None:
        if graph.native is None:
            return
        self.released.append(graph.size)
        arena = graph.arena
        graph.native = None
        graph.outputs = None
        graph.arena = None
        if isinstance(arena, _FakeArena):
            arena.live -= 1
            if arena.live == 0:
                if arena is self._arena:
                    self._arena = None
                if arena in self._sealed:
                    self._sealed.remove(arena)

    def drain(self) -> None:
        """Nothing to give back: the double holds no device memory of its own."""
        return None
