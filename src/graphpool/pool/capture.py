"""Capturing one graph: warm-up and capture into the graph's own mempool, footprint, replay, release.

The ``Capturer`` protocol is the seam between the pool and CUDA: ``CudaGraphCapturer`` is the real one;
``graphpool.pool.testing.EagerCapturer`` stands in for it in CPU tests.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from graphpool.pool import cuda_state
from graphpool.pool.cuda_state import CAPTURE_LOCK
from graphpool.pool.failures import CaptureError, CaptureFailureKind, classify, is_oom

# NOTE: only these mean a failed capture; any other error (the warm-up's) is the step's own and propagates.
CAPTURE_ERRORS: tuple[type[BaseException], ...] = (CaptureError,)

# Released MemPools kept while tensors live in them; past this many the oldest goes (empty_cache frees it).
_MAX_DRAINING = 16


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while allocations are routed to a graph's pool: a MemPool it frees then (a failed
    capture's traceback cycle) runs emptyCache mid-capture, and torch aborts the process."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(eq=False)
class CapturedGraph:
    """One captured graph of batch size ``size``. ``outputs`` are the step's outputs recorded at capture:
    static tensors that every replay overwrites."""

    size: int
    outputs: Any
    footprint: int  # device bytes the warm-up and capture took, driver view (0 where unmeasurable)
    seconds: float  # warm-up + capture wall time: the stall a capture costs
    native: Any  # torch.cuda.CUDAGraph, or the test double's callable
    pool_id: Any = None  # the id of the mempool the graph was captured into
    mempool: Any = None  # the torch.cuda.MemPool holding the graph's memory


class Capturer(Protocol):
    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        """Warm ``fn`` up, capture it, return the graph. Raises ``CaptureError`` on failure, after cleaning
        up its partial state."""

    def replay(self, graph: CapturedGraph) -> None:
        """Re-run the captured work on the current stream (no host sync)."""

    def release(self, graph: CapturedGraph) -> None:
        """Drop the graph, its outputs and its mempool reference, returning its memory where the layout can."""

    def drain(self) -> None:
        """Return the memory of released graphs whose outputs were still referenced when they were released,
        once those are gone (called at the start of every step; cheap when there is nothing to do)."""


class CudaGraphCapturer:
    """Real CUDA graphs. ``layout="per_graph"``: one ``torch.cuda.MemPool`` per graph, which holds the eager
    warm-up's blocks as well as the capture's, so the footprint is everything the graph made the process
    hold, and releasing the graph gives exactly that memory back (no process-wide ``empty_cache()``).
    ``layout="shared"``: all graphs share one MemPool (small while all are resident, but eviction frees
    nothing until every graph on it is gone)."""

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
        self._shared: Any = None  # the shared layout's MemPool
        self._shared_live = 0  # graphs alive on self._shared
        self._draining: list[Any] = []  # released MemPools that still had live tensors

    @property
    def fixed_overhead(self) -> int | None:
        """Device bytes the capture stream took once per process (cuBLAS workspaces), outside any graph."""
        return cuda_state.capture_stream_overhead(self.device)

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        with CAPTURE_LOCK, torch.cuda.device(self.device), _gc_paused():
            self._drain()
            stream = cuda_state.side_stream(self.device)
            t0 = time.perf_counter()
            # NOTE: before the warm-up, whose blocks take new segments in the graph's pool: the delta is all.
            free_before = torch.cuda.mem_get_info(self.device)[0]
            mempool = self._pool_for_capture()
            uses = mempool.use_count()
            # The static inputs were written on the current stream; warm up on the side stream after them.
            stream.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(stream), torch.cuda.use_mem_pool(mempool):
                    for _ in range(self.warmup_iters):
                        fn()
                torch.cuda.synchronize()
            except Exception as e:
                traceback.clear_frames(e.__traceback__)
                self._retire_unused(mempool)
                if is_oom(e):
                    raise CaptureError(CaptureFailureKind.OOM, size, e) from e
                raise
            graph, outputs = self._record(size, fn, stream, mempool, uses)
            free_after = torch.cuda.mem_get_info(self.device)[0]
            if self.layout == "shared":
                self._shared_live += 1
            return CapturedGraph(
                size=size,
                outputs=outputs,
                footprint=max(0, free_before - free_after),
                seconds=time.perf_counter() - t0,
                native=graph,
                pool_id=mempool.id,
                mempool=mempool,
            )

    def _record(
        self, size: int, fn: Callable[[], Any], stream: torch.cuda.Stream, mempool: Any, uses: int
    ) -> tuple[torch.cuda.CUDAGraph, Any]:
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream()
        step_error: Exception | None = None
        failure: Exception | None = None
        outputs = None
        try:
            with torch.cuda.stream(stream):
                # NOTE: not torch.cuda.graph(), whose __enter__ runs empty_cache() on every capture.
                graph.capture_begin(pool=mempool.id, capture_error_mode="thread_local")
                try:
                    outputs = fn()
                except Exception as e:
                    step_error = e
                graph.capture_end()
            torch.cuda.synchronize()
        except Exception as e:
            failure = e
        if step_error is None and failure is None:
            return graph, outputs
        torch.cuda.set_stream(caller_stream)
        cause = step_error if step_error is not None else failure
        assert cause is not None
        for e in (step_error, failure):
            if e is not None:
                # the step's finished frames still hold tensors from the graph's pool
                traceback.clear_frames(e.__traceback__)
        outputs = None
        self._undo_failed(graph, stream, mempool, uses)
        del graph
        if self.layout == "shared" and mempool is self._shared and self._shared_live > 0:
            # NOTE: torch refuses a capture into a pool one failed in; its graphs keep it till the last goes.
            self._shared, self._shared_live = None, 0
        else:
            self._retire_unused(mempool)
        raise CaptureError(classify(cause, raised_by_step=step_error is not None), size, cause) from cause

    def _undo_failed(self, graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, mempool: Any, uses: int) -> None:
        """Leave no capture state behind (see graphpool.pool.cuda_state): the stream, the allocator's
        routing to the pool (before the graph, which its filter points at, is freed), the pool's uses, and
        the generator's capture mode."""
        cuda_state.end_open_capture(graph, stream)
        cuda_state.end_stale_allocation(self.device, mempool.id)
        graph.reset()
        cuda_state.release_leaked_uses(self.device, mempool, uses)
        cuda_state.reset_generator(self.device, stream)

    def _pool_for_capture(self) -> Any:
        if self.layout == "per_graph":
            return torch.cuda.MemPool()
        if self._shared is None:
            self._shared = torch.cuda.MemPool()
        return self._shared

    def _retire_unused(self, mempool: Any) -> None:
        """Retire a pool no graph uses (a fresh per-graph pool, or the shared one with no graph left)."""
        if self.layout == "per_graph":
            self._retire(mempool)
        elif self._shared_live == 0 and mempool is self._shared:
            self._shared = None
            self._retire(mempool)

    def _retire(self, mempool: Any) -> None:
        self._draining.append(mempool)
        self._drain()

    def _drain(self) -> None:
        """Drop the retired MemPools no tensor lives in any more: dropping one releases its last use and
        empties that pool alone (MemPool's destructor calls the allocator's emptyCache(pool id))."""
        keep = [mp for mp in self._draining if cuda_state.has_live_blocks(self.device, mp)]
        self._draining = keep[-_MAX_DRAINING:]

    def replay(self, graph: CapturedGraph) -> None:
        graph.native.replay()

    def drain(self) -> None:
        if self._draining:
            with CAPTURE_LOCK, torch.cuda.device(self.device):
                self._drain()

    def release(self, graph: CapturedGraph) -> None:
        if graph.native is None:
            return
        with CAPTURE_LOCK, torch.cuda.device(self.device):
            graph.native.reset()
            mempool = graph.mempool
            graph.native = None
            graph.outputs = None
            graph.pool_id = None
            graph.mempool = None
            if self.layout == "shared" and mempool is self._shared:
                self._shared_live -= 1
            self._retire_unused(mempool)
