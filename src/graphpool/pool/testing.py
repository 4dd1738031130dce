"""Test doubles for the pool, usable by any part's CPU tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from graphpool.pool.capture import CapturedGraph
from graphpool.pool.failures import CaptureError, classify


def copy_outputs(dst: Any, src: Any) -> None:
    """Copy a step's outputs (a tensor, or a nested tuple/list of tensors) into same-shaped static ones."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
        return
    for d, s in zip(dst, src, strict=True):
        copy_outputs(d, s)


class EagerCapturer:
    """A capturer without CUDA: "capture" runs the step twice (warm-up, then the run whose outputs become the
    static outputs); "replay" runs it again and copies the result into those outputs, so replay semantics
    (static inputs in, the same output tensors overwritten) match a real graph's.

    ``footprint``: fake bytes per graph, a constant or a function of the size.
    ``fail_sizes``: sizes whose capture fails with ``error(message)`` as if ``capture_end`` raised it
    (mutable: tests may change it). ``capturing`` is True while the step runs "under capture", so a test
    step can raise only there; both surface as ``CaptureError``, classified as the real capturer does.
    """

    def __init__(
        self,
        footprint: int | Callable[[int], int] = 0,
        fail_sizes: Iterable[int] = (),
        error: Callable[[str], BaseException] = torch.OutOfMemoryError,
        seconds: float = 0.0,
    ) -> None:
        self.footprint = footprint
        self.fail_sizes = set(fail_sizes)
        self.error = error
        self.seconds = seconds
        self.captured: list[int] = []  # sizes, in capture order
        self.released: list[int] = []
        self.replays = 0
        self.capturing = False

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        fn()  # warm-up, as the real capturer does
        if size in self.fail_sizes:
            err = self.error(f"EagerCapturer: induced capture failure at size {size}")
            raise CaptureError(classify(err, raised_by_step=False), size, err) from err
        self.capturing = True
        try:
            outputs = fn()
        except Exception as e:
            raise CaptureError(classify(e, raised_by_step=True), size, e) from e
        finally:
            self.capturing = False
        nbytes = self.footprint(size) if callable(self.footprint) else self.footprint
        self.captured.append(size)
        return CapturedGraph(size=size, outputs=outputs, footprint=nbytes, seconds=self.seconds, native=fn)

    def replay(self, graph: CapturedGraph) -> None:
        self.replays += 1
        fresh = graph.native()
        # NOTE: a real replay writes inference-tensor outputs whatever the mode: so must the double.
        with torch.inference_mode():
            copy_outputs(graph.outputs, fresh)

    def release(self, graph: CapturedGraph) -> None:
        if graph.native is None:
            return
        self.released.append(graph.size)
        graph.native = None
        graph.outputs = None

    def drain(self) -> None:
        """Nothing to give back: the double holds no device memory of its own."""
        return None
