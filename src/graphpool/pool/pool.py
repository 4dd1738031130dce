"""GraphPool: replay a decode step through a bounded pool of CUDA graphs, one graph per bucket size."""

from __future__ import annotations

import logging
import math
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from graphpool.pool.capture import CapturedGraph, Capturer, CudaGraphCapturer
from graphpool.pool.config import PoolConfig
from graphpool.pool.failures import CaptureError, CaptureFailureLog
from graphpool.pool.inputs import Batch, InputSpec, StaticInputs
from graphpool.pool.lockstep import CaptureSync, Decision, agree_on_capture
from graphpool.pool.management import PoolManagement
from graphpool.pool.policy import CAPTURE, CaptureOnMiss, Choice, ResidencyBook, make_policy, nearest_larger
from graphpool.pool.routing import Route, _EvictionLog, graphs_off
from graphpool.pool.stats import FallbackReason, PoolStats, StatsCounters

logger = logging.getLogger(__name__)

__all__ = ["Decision", "GraphPool", "InputSpec", "Route", "graphs_off"]


def _slice(out: Any, rows: int, clone: bool) -> Any:
    if isinstance(out, torch.Tensor):
        return out[:rows].clone() if clone else out[:rows]
    return tuple(_slice(o, rows, clone) for o in out)


class GraphPool(PoolManagement):
    """A bounded pool of captured graphs over ``step``. See docs/architecture.md for the contract.

    ``step(*microbatches)`` takes one mapping of static tensors per microbatch and returns, per microbatch,
    a batch-first tensor or tuple of tensors (with two microbatches: a pair of those). Thread-safe: one
    RLock (``pool.lock``) guards pool state and the copy+replay; hold it yourself across ``run`` and the use
    of its outputs if other threads may run the pool meanwhile (or pass ``clone=True``), and across
    ``decide`` and the ``run`` that applies its decision.

    Tensor parallel (``pool.lockstep``): the leading rank calls ``decide`` and sends the decision with the
    step's batch; every rank calls ``run(..., decision=...)``. ``capture_sync`` (a collective: element-wise
    max over ranks) is called after every capture, so that all ranks keep or drop each graph together.
    """

    def __init__(
        self,
        step: Callable[..., Any],
        specs: Iterable[InputSpec],
        config: PoolConfig | None = None,
        device: torch.device | str = "cuda",
        capturer: Capturer | None = None,
        *,
        miss_policy: CaptureOnMiss | None = None,
        capture_sync: CaptureSync | None = None,
    ) -> None:
        self.config = config = config if config is not None else PoolConfig()
        self.step = step
        self._inputs = StaticInputs(specs, config.num_microbatches, device)
        self.specs, self.device = self._inputs.specs, self._inputs.device
        self.ladder = config.ladder()
        self.policy = miss_policy if miss_policy is not None else make_policy(config)
        self.lock = threading.RLock()
        self._sync = capture_sync
        self._book = ResidencyBook(config.max_graph_pool_size, config.graph_memory_budget, config.pinned)
        self._graphs: dict[int, CapturedGraph] = {}
        self._blocked: dict[int, FallbackReason] = {}  # sizes never replayed again
        # sizes admitted while served padded (defer_captures), oldest first: the steps each was served padded since
        self._wanted: dict[int, int] = {}
        self._counters = StatsCounters()
        self._evictions = _EvictionLog()
        self._failures = CaptureFailureLog(logger)
        self._closed = False
        # Whether the latest run() replayed a graph: cheap to read for a single caller thread (the engine).
        self.last_replayed = False
        self._off = graphs_off(config.enabled, self.device, capturer is not None)
        self._capturer: Capturer | None = None
        if self._off is None:
            self._capturer = capturer if capturer is not None else CudaGraphCapturer(self.device, config.mempool)
            self._inputs.allocate(self.ladder.max_size)

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def graphs_off(self) -> FallbackReason | None:
        """Why this pool never replays a graph (``graphs_off``: no CUDA, disabled), or None."""
        return self._off

    def can_run(self, batch_size: int, max_len_in_batch: int = 0) -> bool:
        """Whether a step of this (per-microbatch) batch size and length may use a graph at all."""
        return not self._closed and batch_size >= 1 and self.route(batch_size, max_len_in_batch).reason is None

    def resident_sizes(self) -> tuple[int, ...]:
        """Resident graph sizes, least recently used first."""
        with self.lock:
            return self._book.sizes()

    @property
    def num_captures(self) -> int:
        """Graphs captured so far (a plain counter read: cheap enough to take around every step)."""
        return self._counters.captures

    @property
    def wanted_sizes(self) -> tuple[int, ...]:
        """Sizes admitted while a larger graph served them padded, waiting for `capture_wanted` (oldest first)."""
        return tuple(self._wanted)

    def stats(self) -> PoolStats:
        with self.lock:
            return self._counters.snapshot(self._book.sizes(), self._book.total_bytes, self._book.arena_bytes)

    # ---- the step ------------------------------------------------------------------------------------
    def decide(self, batch_size: int, max_len_in_batch: int = 0) -> Decision:
        """The decision for a step of this (per-microbatch) batch size, to pass to ``run`` here and on the
        other ranks. It counts as the step's policy observation: call it once per step."""
        if batch_size < 1:
            raise ValueError(f"decide() needs a batch size >= 1, got {batch_size}")
        with self.lock:
            return self._graph_for(batch_size, max_len_in_batch)

    def resident_decision(self, batch_size: int, max_len_in_batch: int = 0) -> Decision | None:
        """A replay of a resident graph that serves this batch (its bucket's, else the smallest larger one),
        or None; never a capture, and the policy does not observe it. For callers that borrow the resident
        graphs for other steps of the same shape (the engine's small prefills run as decode rows)."""
        with self.lock:
            route = self.route(batch_size, max_len_in_batch)
            bucket = route.bucket
            if route.reason is not None or bucket is None:
                return None
            if bucket in self._graphs:
                return Decision("hit", bucket, bucket)
            larger = nearest_larger(self._graphs, bucket, math.inf)
            return Decision("pad", bucket, larger) if larger is not None else None

    def run(self, inputs: Batch | Sequence[Batch], max_len_in_batch: int = 0, *, clone: bool = False,
            decision: Decision | None = None) -> Any:
        """Run one step: replay a graph if one serves this batch, else ``step`` eagerly on the live inputs.

        Graph outputs are views of the graph's static outputs, sliced to the live rows of each microbatch,
        valid until the next ``run`` of any size (the arena layout's graphs share their outputs' memory);
        ``clone=True`` returns copies instead. ``decision``: apply this one (from ``decide``, here or on the
        leading rank) instead of deciding now.
        """
        mbs, rows = self._inputs.check(inputs)
        if max(rows) < 1:
            raise ValueError("run() got an empty batch")
        if self._closed:
            raise RuntimeError("GraphPool.run() after close()")
        with self.lock:
            if self._capturer is not None:
                self._capturer.drain()
            if decision is None:
                decision = self._graph_for(max(rows), max_len_in_batch)
            elif decision.bucket != self.route(max(rows)).bucket:
                raise ValueError(f"a decision for bucket {decision.bucket} applied to a batch of {max(rows)} rows")
            self._counters.steps += 1
            got = self._apply(decision, mbs, rows)
            if isinstance(got, CapturedGraph):
                if decision.action != "capture":  # a capture step's inputs were written before it
                    self._inputs.write(mbs, rows, got.size)
                self._capturer.replay(got)  # type: ignore[union-attr]
                self.last_replayed = True
                outs = [got.outputs] if len(mbs) == 1 else list(got.outputs)
                sliced = [_slice(o, r, clone) for o, r in zip(outs, rows, strict=True)]
                return sliced[0] if len(mbs) == 1 else tuple(sliced)
            self._counters.fallbacks[got] += 1
            self.last_replayed = False
        return self.step(*self._inputs.on_device(mbs))

    def route(self, batch_size: int, max_len_in_batch: int = 0) -> Route:
        """The routing of a step of this (per-microbatch) batch size and length, asked by ``_graph_for`` (so by
        ``decide`` and ``run``) and by callers that run some eager steps themselves. The reason is the first of:
        no CUDA; a context past ``max_len_in_batch`` (a caller whose step bakes that bound in runs such a step
        itself, with a wider one); graphs disabled; a batch above the ladder. Reads only the configuration."""
        if self._off is FallbackReason.NO_CUDA:
            return Route(None, self._off)
        bucket = None if self._off is not None else self.ladder.find_closest(batch_size)
        if max_len_in_batch > self.config.max_len_in_batch:
            return Route(bucket, FallbackReason.LEN_TOO_LARGE)
        if self._off is not None:
            return Route(None, self._off)
        return Route(None, FallbackReason.BATCH_TOO_LARGE) if bucket is None else Route(bucket)

    def _graph_for(self, batch_size: int, max_len_in_batch: int) -> Decision:
        """The whole graph decision of one step: the graph to replay (the bucket's, or a larger one to pad
        into), a capture now, or why the step runs eagerly. Reads the pool; changes only the policy's view and
        (defer_captures) the sizes wanted for capture_wanted."""
        route = self.route(batch_size, max_len_in_batch)
        if route.reason is not None:
            return Decision.eager(route.reason, route.bucket)
        bucket = route.bucket
        assert bucket is not None
        self.policy.observe(bucket)
        if bucket in self._graphs:
            return Decision("hit", bucket, bucket)
        if bucket in self._blocked:
            return Decision.eager(self._blocked[bucket], bucket, missed=True)
        if bucket not in self._book.pinned:  # NOTE: a pinned size is meant to be resident: no policy asked
            choice = self._policy_choice(bucket)
            if isinstance(choice, FallbackReason):
                return Decision.eager(choice, bucket, missed=True)
            if choice != CAPTURE:
                if not isinstance(choice, int) or choice < bucket or choice not in self._graphs:
                    raise ValueError(f"miss policy answered bs={bucket} with {choice!r}: neither CAPTURE, "
                                     "a FallbackReason nor a resident size above the bucket")
                return Decision("pad", bucket, choice, missed=True)
        # NOTE: tensor-parallel ranks decide in lockstep, so they capture in the step
        defer = self.config.defer_captures and self._sync is None
        larger = nearest_larger(self._graphs, bucket, math.inf) if defer else None
        if larger is not None:
            padded = self._wanted.get(bucket, 0) + 1
            if padded <= self.config.defer_max_padded_steps:
                self._wanted[bucket] = padded
                return Decision("pad", bucket, larger, missed=True)
        self._wanted.pop(bucket, None)
        return Decision("capture", bucket, bucket, missed=True)

    def _policy_choice(self, bucket: int) -> Choice:
        """The miss policy's answer for `bucket` as the pool stands: room for it or not, and the first victim."""
        victims = self._book.victims(self._book.estimate(bucket), arena_need=self._book.arena_estimate(bucket))
        return self.policy.on_miss(bucket, self._book.sizes(), victims == [], victims[0] if victims else None)

    def _apply(self, d: Decision, mbs: Sequence[Batch], rows: Sequence[int]) -> CapturedGraph | FallbackReason:
        """Carry a decision out (the same on every rank): count it, touch or capture the graph."""
        if d.missed:
            self._counters.misses += 1
        if d.action == "eager":
            assert d.reason is not None
            return d.reason
        assert d.size is not None
        if d.action == "capture":
            self._inputs.write(mbs, rows, d.size)
            return self._capture(d.size, may_evict=True)
        graph = self._graphs.get(d.size)
        if graph is None:
            raise RuntimeError(f"decision {d} names bs={d.size}, which is not resident here (pools out of step)")
        self._book.touch(d.size)
        if d.action == "hit":
            self._counters.hits += 1
        else:
            self._counters.padded_hits += 1
        return graph

    def _capture(self, size: int, may_evict: bool) -> CapturedGraph | FallbackReason:
        """Capture ``size`` from the static inputs as they are now, keeping the pool within its bounds."""
        book = self._book
        victims = book.victims(book.estimate(size), arena_need=book.arena_estimate(size), may_evict=may_evict)
        if victims is None:  # the upper bound does not fit: try the lower; the footprint is checked after
            victims = book.victims(book.lower_estimate(size), arena_need=book.arena_estimate(size, upper=False),
                                   may_evict=may_evict)
            if victims is None:
                return FallbackReason.OVER_BUDGET
        for v in victims:
            self._evict(v, "lru" if len(book) >= book.capacity else "budget")
        views = self._inputs.views(size)
        capturer = self._capturer
        assert capturer is not None
        try:
            got: CapturedGraph | CaptureError = capturer.capture(size, lambda: self.step(*views))
        except CaptureError as e:
            # NOTE: the capturer's finished frames hold its mempool: a logged or kept error must not pin it
            for tb in (e.__traceback__, e.cause.__traceback__):
                traceback.clear_frames(tb)
            got = e
        if self._sync is not None:  # NOTE: tensor parallel: every rank keeps the graph, or none does
            got = agree_on_capture(self._sync, size, got, capturer.release)
        if isinstance(got, CaptureError):
            self._counters.capture_failures_by_kind[got.kind.value] += 1
            self._blocked[size] = FallbackReason.CAPTURE_FAILED
            self._failures.note(size, got)
            return FallbackReason.CAPTURE_FAILED
        graph = got
        self._counters.captured(graph.seconds)
        self._graphs[size] = graph
        book.add(size, graph.footprint, graph.arena_bytes)
        alone = graph.footprint + graph.arena_bytes
        if book.budget is not None and alone > book.budget:
            self._blocked[size] = FallbackReason.OVER_BUDGET
            logger.warning("graph pool: bs=%d needs %d bytes (with its arena), more than the whole budget %d",
                           size, alone, book.budget)
            self._evict(size, "alone over budget")
            self._fit_budget()
            return FallbackReason.OVER_BUDGET
        victims = book.victims(keep=size, may_evict=may_evict)
        if victims is None:
            self._evict(size, "over budget")
            self._fit_budget()
            return FallbackReason.OVER_BUDGET
        for v in victims:
            self._evict(v, "budget")
        return graph

    def _fit_budget(self) -> None:
        """Evict LRU graphs while the arena a dropped capture grew keeps the rest over the budget (the arena
        goes back with its last graph): the budget binds even where the caller asked not to evict."""
        for v in self._book.victims() or ():
            self._evict(v, "arena over budget")

    def _evict(self, size: int, why: str) -> None:
        graph = self._graphs.pop(size)
        nbytes = self._book.remove(size)
        self._capturer.release(graph)  # type: ignore[union-attr]
        self._counters.evictions += 1
        self._evictions.note(size, nbytes, why)
