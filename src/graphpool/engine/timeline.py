"""The engine's step timeline: what each step was and when it ran, kept for later attribution of latency.

Start times are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the machine), so a
client on the same machine can put its own token arrival times on the same axis. On CUDA the forward's device
time is read from a pair of events per step, resolved when they have completed: recording never syncs.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol

import torch

from graphpool.engine.outputs import StepInfo

DEFAULT_CAPACITY = 200_000  # steps kept (the oldest are dropped): about 10 minutes of serving at 300 steps/s


@dataclass(frozen=True)
class StepRecord(StepInfo):
    """A step as the engine reports it (`StepInfo`), with the forward's GPU time once its events completed."""

    device_seconds: float | None = None  # the forward's GPU time (CUDA only)


class StepTimeline:
    """A bounded record of engine steps (engine thread only)."""

    def __init__(self, device: torch.device, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"step timeline capacity must be >= 1, got {capacity}")
        self._cuda = device.type == "cuda"
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._pending: deque[tuple[int, torch.cuda.Event, torch.cuda.Event]] = deque()
        self._added = 0  # records ever added; a pending entry names its record by this count

    def forward_events(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """A (start, end) event pair to record around the forward, or None off CUDA."""
        if not self._cuda:
            return None
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def add(self, info: StepInfo, events: tuple[torch.cuda.Event, torch.cuda.Event] | None) -> None:
        self._records.append(StepRecord(**vars(info)))
        self._added += 1
        if events is not None:
            self._pending.append((self._added - 1, *events))
        self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        first = self._added - len(self._records)  # the count of the oldest record still kept
        while self._pending:
            index, start, end = self._pending[0]
            if not wait and not end.query():
                return
            self._pending.popleft()
            if index < first:
                continue
            if wait:
                end.synchronize()
            pos = index - first
            rec = self._records[pos]
            self._records[pos] = replace(rec, device_seconds=start.elapsed_time(end) / 1e3)

    def __len__(self) -> int:
        return len(self._records)

    def export(self) -> dict[str, Any]:
        """Every kept record (device times resolved: waits for the last steps' events), as plain JSON."""
        self._resolve(wait=True)
        names = [f.name for f in fields(StepRecord)]
        return {
            "clock": "time.monotonic",
            "fields": names,
            "dropped": self._added - len(self._records),
            "steps": [[getattr(r, f) for f in names] for r in self._records],
        }


class CaptureCounter(Protocol):
    @property
    def num_captures(self) -> int: ...


class StepClock:
    """One step's bookkeeping, from its start to its `StepInfo` in the timeline: the wall clocks, the events
    around its forward and the graphs it captured (the synchronous step and async scheduling's both use it)."""

    def __init__(self, timeline: StepTimeline | None, pool: CaptureCounter, chained: bool = False) -> None:
        self._start = time.perf_counter()
        self._start_mono = time.monotonic()
        self._timeline = timeline
        self._pool = pool
        self._captures_before = pool.num_captures
        self._marks = timeline.forward_events() if timeline is not None else None
        self._captures = 0  # graphs captured in the step's own forward
        self._chained = chained  # launched by async scheduling on the device tokens of the step before

    def forward_begins(self) -> None:
        if self._marks is not None:
            self._marks[0].record()

    def forward_ends(self) -> None:
        if self._marks is not None:
            self._marks[1].record()
        # NOTE: counted here, not at close: under async scheduling the next step's launch (and its captures)
        # comes before this step closes
        self._captures = self._pool.num_captures - self._captures_before

    def close(self, kind: Literal["prefill", "decode", "mixed"], batch_size: int, num_tokens: int, graph: bool,
              forward_seconds: float | None = None) -> StepInfo:
        """The step's StepInfo (its wall time ends now), added to the timeline."""
        info = StepInfo(kind=kind, batch_size=batch_size, num_tokens=num_tokens,
                        seconds=time.perf_counter() - self._start, graph=graph, forward_seconds=forward_seconds,
                        start=self._start_mono, captures=self._captures, chained=self._chained)
        if self._timeline is not None:
            self._timeline.add(info, self._marks)
        return info


def records_from_export(data: dict[str, Any]) -> list[StepRecord]:
    """The records of an ``export()`` (e.g. read back from the server's JSON)."""
    fields = data["fields"]
    return [StepRecord(**dict(zip(fields, row, strict=True))) for row in data["steps"]]
