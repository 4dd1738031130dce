"""Capturing one graph: warm-up and capture into a mempool, the bytes it took, replay, release.

The ``Capturer`` protocol is the seam between the pool and CUDA: ``CudaGraphCapturer`` is the real one;
``graphpool.pool.testing.EagerCapturer`` stands in for it in CPU tests.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from graphpool.pool import cuda_state
from graphpool.pool.arena import Arena, Retired, alias_outputs, output_bytes
from graphpool.pool.config import LAYOUTS, MempoolLayout
from graphpool.pool.cuda_state import CAPTURE_LOCK
from graphpool.pool.failures import CaptureError, CaptureFailureKind, classify, is_oom
from graphpool.pool.gc_control import gc_paused

# NOTE: only these mean a failed capture; any other error (the warm-up's) is the step's own and propagates.
CAPTURE_ERRORS: tuple[type[BaseException], ...] = (CaptureError,)

# Released MemPools kept while tensors live in them; past this many the oldest goes (empty_cache frees it).
_MAX_DRAINING = 16


@dataclass(frozen=True)
class CaptureMemory:
    """Where one capture's device bytes went (driver view, from ``mem_get_info``, split by the caching
    allocator's view of the mempool the graph was captured into)."""

    outputs: int = 0  # bytes of the step's outputs
    pool: int = 0  # the mempool's segments after the capture (per_graph: the graph's own; arena: the shared one)
    pool_growth: int = 0  # how much this capture grew them (activations, outputs, allocator rounding)
    graph: int = 0  # the capture's driver bytes outside the mempool: the graph executable, its kernel parameters
    first_use: int = 0  # the warm-up's driver bytes outside the mempool: modules loaded on a kernel's first launch


@dataclass(eq=False)
class CapturedGraph:
    """One captured graph of batch size ``size``. ``outputs`` are the step's outputs recorded at capture:
    static tensors that every replay overwrites."""

    size: int
    outputs: Any
    footprint: int  # device bytes this graph alone holds (what releasing it gives back; 0 where unmeasurable)
    seconds: float  # warm-up + capture wall time: the stall a capture costs
    native: Any  # torch.cuda.CUDAGraph, or the test double's callable
    pool_id: Any = None  # the id of the mempool the graph was captured into
    mempool: Any = None  # the torch.cuda.MemPool holding the graph's memory
    arena_bytes: int = 0  # bytes of every arena the capturer holds after this capture (shared by the graphs)
    arena: Any = None  # the shared MemPool's record (arena and shared layouts)
    memory: CaptureMemory | None = None


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
    """Real CUDA graphs, in one of three mempool layouts.

    ``arena`` (default): every graph's warm-up and capture allocate from one shared MemPool, largest size
    first, and a graph's outputs are aliases into it (graphpool.pool.arena), so the arena holds one step's
    worth of activations and outputs, the largest, and a graph holds no device memory of its own (its
    executable lives in the driver's heap: ``process_overhead``). The arena goes back with its last graph.
    ``per_graph``: one MemPool per graph, which holds the eager warm-up's blocks as well as the capture's, so
    the footprint is everything the graph made the process hold, and releasing the graph gives exactly that
    memory back (no process-wide ``empty_cache()``).
    ``shared``: all graphs share one MemPool and keep their outputs in it (eviction frees nothing until every
    graph on it is gone).
    """

    def __init__(self, device: torch.device | str | int = "cuda", layout: MempoolLayout = "arena",
                 warmup_iters: int = 1) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if warmup_iters < 1:
            raise ValueError(f"warmup_iters must be >= 1, got {warmup_iters}")
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaGraphCapturer needs a CUDA device, got {self.device}")
        self.layout = layout
        self.warmup_iters = warmup_iters
        self._arena: Arena | None = None  # where the next capture goes (arena and shared layouts)
        self._sealed: list[Arena] = []  # arenas a capture failed in, kept for the graphs still on them
        self._draining: list[Retired] = []  # released MemPools whose memory may still be read
        # arena layout: driver bytes the captures took outside every mempool (the executables' heap, modules
        # first loaded in a warm-up): the process's, kept by the driver and reused by later captures
        self.process_overhead = 0

    @property
    def fixed_overhead(self) -> int | None:
        """Device bytes the capture stream took once per process (cuBLAS workspaces), outside any graph."""
        return cuda_state.capture_stream_overhead(self.device)

    def arena_bytes(self) -> int:
        """Bytes of the arenas that graphs live in (0 in the per_graph layout)."""
        if self.layout != "arena":
            return 0
        live = [a for a in (self._arena, *self._sealed) if a is not None and a.live > 0]
        return sum(a.nbytes for a in live)

    def capture(self, size: int, fn: Callable[[], Any]) -> CapturedGraph:
        with CAPTURE_LOCK, torch.cuda.device(self.device), gc_paused():
            self._drain()
            stream = cuda_state.side_stream(self.device)
            t0 = time.perf_counter()
            arena = self._arena_for_capture()
            mempool = arena.mempool if arena is not None else torch.cuda.MemPool()
            uses = mempool.use_count()
            # NOTE: before the warm-up, whose blocks take new segments in the pool: the deltas are all. The
            # allocator's growth meanwhile is the pool's (allocations route to it), the rest is the driver's.
            free0, pool0 = self._free_and_reserved()
            # The static inputs were written on the current stream; warm up on the side stream after them.
            stream.wait_stream(torch.cuda.current_stream())
            try:
                with torch.cuda.stream(stream), torch.cuda.use_mem_pool(mempool):
                    for _ in range(self.warmup_iters):
                        fn()
                torch.cuda.synchronize()
            except Exception as e:
                traceback.clear_frames(e.__traceback__)
                if arena is not None:
                    arena.nbytes += max(0, self._free_and_reserved()[1] - pool0)
                self._drop_unused(mempool, arena)
                if is_oom(e):
                    raise CaptureError(CaptureFailureKind.OOM, size, e) from e
                raise
            free1, pool1 = self._free_and_reserved()
            graph, outputs = self._record(size, fn, stream, mempool, arena, uses, pool0)
            free2, pool2 = self._free_and_reserved()
            growth = max(0, pool2 - pool0)
            if arena is not None:
                arena.live += 1
                arena.nbytes += growth
            memory = CaptureMemory(
                outputs=output_bytes(outputs), pool=arena.nbytes if arena is not None else growth, pool_growth=growth,
                graph=max(0, free1 - free2 - (pool2 - pool1)), first_use=max(0, free0 - free1 - (pool1 - pool0)),
            )
            footprint = max(0, free0 - free2)
            if self.layout == "arena":
                assert arena is not None and arena.lease is not None
                try:
                    # NOTE: the owning outputs die here: their blocks go back to the arena for the next capture
                    outputs = alias_outputs(outputs, arena.lease)
                except Exception as e:
                    outputs = None
                    graph.reset()
                    arena.live -= 1
                    self._drop_unused(mempool, arena)
                    raise CaptureError(CaptureFailureKind.ERROR, size, e) from e
                # NOTE: the executable's bytes are the driver's heap, which eviction does not shrink
                footprint = 0
                self.process_overhead += memory.graph + memory.first_use
            return CapturedGraph(size=size, outputs=outputs, footprint=footprint,
                                 seconds=time.perf_counter() - t0, native=graph, pool_id=mempool.id,
                                 mempool=mempool, arena_bytes=self.arena_bytes(), arena=arena, memory=memory)

    def _free_and_reserved(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info(self.device)[0], torch.cuda.memory_reserved(self.device)

    def _record(self, size: int, fn: Callable[[], Any], stream: torch.cuda.Stream, mempool: Any,
                arena: Arena | None, uses: int, reserved0: int) -> tuple[torch.cuda.CUDAGraph, Any]:
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
        if arena is not None:
            arena.nbytes += max(0, self._free_and_reserved()[1] - reserved0)
        if arena is not None and arena.live > 0:
            # NOTE: torch refuses a capture into a pool one failed in; its graphs keep it till the last goes.
            self._arena = None
            self._sealed.append(arena)
        else:
            self._drop_unused(mempool, arena)
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

    def _arena_for_capture(self) -> Arena | None:
        """The arena the next capture goes into (a fresh one when none is open); None: a fresh per-graph pool."""
        if self.layout == "per_graph":
            return None
        if self._arena is None:
            self._arena = Arena(torch.cuda.MemPool())
        return self._arena

    def _drop_unused(self, mempool: Any, arena: Arena | None) -> None:
        """Retire a pool no graph uses (a fresh per-graph pool, or an arena with no graph left)."""
        if arena is None:
            self._retire(Retired(mempool))
        elif arena.live == 0:
            self._retire_arena(arena)

    def _retire_arena(self, arena: Arena) -> None:
        if arena is self._arena:
            self._arena = None
        if arena in self._sealed:
            self._sealed.remove(arena)
        self._retire(arena.retire())

    def _retire(self, retired: Retired) -> None:
        self._draining.append(retired)
        self._drain()

    def _drain(self) -> None:
        """Drop the retired MemPools whose memory nothing reads any more: dropping one releases its last use
        and empties that pool alone (MemPool's destructor calls the allocator's emptyCache(pool id))."""
        keep = [r for r in self._draining if r.leased() or cuda_state.has_live_blocks(self.device, r.mempool)]
        # NOTE: a leased pool is never dropped: an output alias would read memory given back to the driver
        leased = [r for r in keep if r.leased()]
        self._draining = leased + [r for r in keep if not r.leased()][-_MAX_DRAINING:]

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
            mempool, arena = graph.mempool, graph.arena
            graph.native = None
            graph.outputs = None
            graph.pool_id = None
            graph.mempool = None
            graph.arena = None
            if arena is not None:
                arena.live -= 1
            self._drop_unused(mempool, arena)
            del mempool, arena  # NOTE: a MemPool is dropped under CAPTURE_LOCK only (see cuda_state)
