"""Capturing one graph: warm-up on a side stream, capture into a mempool, footprint, replay, release.

The ``Capturer`` protocol is the seam between the pool and CUDA: ``CudaGraphCapturer`` is the real one;
``graphpool.pool.testing.EagerCapturer`` stands in for it in CPU tests.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

# NOTE: the exceptions a failed capture may raise (capture-time OOM is a RuntimeError subclass; CUDA errors
# such as an invalidated capture surface as RuntimeError). Anything else is a bug and propagates.
CAPTURE_ERRORS: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, RuntimeError)

# NOTE: PyTorch allows one graph capture at a time per process; pools have their own locks, so captures by
# different pools (e.g. two engines in one process) are serialized here.
_CAPTURE_LOCK = threading.Lock()

# NOTE: one capture stream per device for the whole process: cuBLAS keeps a workspace (32 MiB on Hopper) per
# (handle, stream) for the life of the process, so a stream per pool would leak one workspace per pool.
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


@dataclass(eq=False)
class CapturedGraph:
    """One captured graph of batch size ``size``. ``outputs`` are the step's outputs recorded at capture:
    static tensors that every replay overwrites."""

    size: int
    outputs: Any
    footprint: int  # device bytes the capture took, driver view (0 where unmeasurable)
    seconds: float  # warm-up + capture wall time: the stall a capture costs
    native: Any  # torch.cuda.CUDAGraph, or the test double's callable
    pool_id: Any = None  # the mempool handle the graph was captured into


class Capturer(Protocol):
    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        """Warm ``fn`` up, capture it, return the graph. Raises one of ``CAPTURE_ERRORS`` on failure, after
        cleaning up its partial state."""

    def replay(self, graph: CapturedGraph) -> None:
        """Re-run the captured work on the current stream (no host sync)."""

    def release(self, graph: CapturedGraph) -> None:
        """Drop the graph, its outputs and its mempool reference, returning its memory where the layout can."""


class CudaGraphCapturer:
    """Real CUDA graphs. ``layout="per_graph"``: one private mempool per graph, so releasing a graph gives its
    memory back to the device. ``layout="shared"``: all graphs share one mempool (small while all are
    resident, but eviction frees nothing until every graph on it is gone)."""

    def __init__(
        self,
        device: torch.device | str | int = "cuda",
        layout: Literal["per_graph", "shared"] = "per_graph",
        warmup_iters: int = 1,
    ) -> None:
        if layout not in ("per_graph", "shared"):
            raise ValueError(f"layout must be 'per_graph' or 'shared', got {layout!r}")
        if warmup_iters < 1:
            raise ValueError(f"warmup_iters must be >= 1, got {warmup_iters}")
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaGraphCapturer needs a CUDA device, got {self.device}")
        self.layout = layout
        self.warmup_iters = warmup_iters
        self._shared_handle: Any = None
        self._shared_live = 0  # graphs alive on _shared_handle

    def _pool_handle(self) -> Any:
        if self.layout == "per_graph":
            return torch.cuda.graph_pool_handle()
        # NOTE: PyTorch asserts (use_count > 0) when capturing into a pool whose graphs all died, so a
        # shared handle is only reused while at least one graph captured into it is alive.
        if self._shared_handle is None or self._shared_live == 0:
            self._shared_handle = torch.cuda.graph_pool_handle()
        return self._shared_handle

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            stream = _side_stream(self.device)
            t0 = time.perf_counter()
            # The static inputs were written on the current stream; warm up on the side stream after them.
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.warmup_iters):
                    fn()
            torch.cuda.synchronize()
            # NOTE: a graph's private pool takes fresh segments from the driver, so the free-memory delta around
            # capture is its footprint even with the warm-up's blocks still cached. torch.cuda.graph() is not
            # used because it runs gc.collect() and empty_cache() on entry: tens of ms added to every miss in a
            # large serving process, and the eager steps would then pay cudaMalloc again.
            free_before = torch.cuda.mem_get_info(self.device)[0]
            graph = torch.cuda.CUDAGraph()
            handle = self._pool_handle()
            caller_stream = torch.cuda.current_stream()
            try:
                with torch.cuda.stream(stream):
                    graph.capture_begin(pool=handle, capture_error_mode="thread_local")
                    try:
                        outputs = fn()
                    finally:
                        graph.capture_end()
                torch.cuda.synchronize()
            except CAPTURE_ERRORS as e:
                # NOTE: if capture_end() raises (invalidated capture), torch.cuda.graph's __exit__ never restores
                # the caller's stream: restore it, or later work would silently run on the side stream.
                torch.cuda.set_stream(caller_stream)
                # The step's finished frames still hold tensors from the graph's pool: drop them so the
                # empty_cache below can give that memory back now.
                traceback.clear_frames(e.__traceback__)
                graph.reset()
                del graph
                torch.cuda.empty_cache()
                raise
            free_after = torch.cuda.mem_get_info(self.device)[0]
            if self.layout == "shared":
                self._shared_live += 1
            return CapturedGraph(
                size=size,
                outputs=outputs,
                footprint=max(0, free_before - free_after),
                seconds=time.perf_counter() - t0,
                native=graph,
                pool_id=handle,
            )

    def replay(self, graph: CapturedGraph) -> None:
        graph.native.replay()

    def release(self, graph: CapturedGraph) -> None:
        if graph.native is None:
            return
        graph.native.reset()
        if self.layout == "shared" and graph.pool_id == self._shared_handle:
            self._shared_live -= 1
        graph.native = None
        graph.outputs = None
        graph.pool_id = None
        with torch.cuda.device(self.device):
            torch.cuda.empty_cache()
