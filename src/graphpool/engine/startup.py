"""Where an engine's start-up went: StartupTimes, filled phase by phase as LLMEngine is built."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, fields

_IMPORTED_AT = time.monotonic()
_first_engine = True  # only the process's first engine paid the imports


def seconds_since_process_start() -> float:
    """Wall time since the process started (Linux: from /proc; elsewhere since this module was imported)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED_AT


@dataclass(frozen=True)
class StartupTimes:
    """Seconds per start-up phase; `total` also holds what no phase names (config checks, the scheduler, the
    pool's static inputs), so the phases sum to at most `total`."""

    # process start until the engine began: interpreter, imports, flags (0 for a process's later engines)
    imports: float = 0.0
    load: float = 0.0  # the model built and its weights and tokenizer loaded (every rank's, tensor parallel)
    kv_cache: float = 0.0  # sizing and allocating the KV cache
    prefill_warmup: float = 0.0  # the eager prefills of the warm-up (engine/warmup.py)
    graph_capture: float = 0.0  # the graph pool's warm-up captures (every rank's, tensor parallel)
    total: float = 0.0  # process start (or, for a later engine, its construction) until the engine was ready

    def phases(self) -> dict[str, float]:
        """Every phase but `total`, in start-up order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "total"}

    def describe(self) -> str:
        """One line: `start-up 3.2 s: imports 1.1, load 1.5, ...`."""
        parts = ", ".join(f"{name.replace('_', ' ')} {seconds:.2f}" for name, seconds in self.phases().items())
        return f"start-up {self.total:.2f} s: {parts}"


class StartupClock:
    """Marks the end of each phase; `times()` is the StartupTimes so far."""

    def __init__(self) -> None:
        global _first_engine
        self._begun = time.perf_counter()
        self._last = self._begun
        self._imports = seconds_since_process_start() if _first_engine else 0.0
        _first_engine = False
        self._seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """`phase` ran from the previous mark (or the clock's start) until now."""
        now = time.perf_counter()
        self._seconds[phase] = self._seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def skip(self) -> None:
        """What ran since the previous mark belongs to no phase (it counts in the total only)."""
        self._last = time.perf_counter()

    def times(self) -> StartupTimes:
        total = self._imports + time.perf_counter() - self._begun
        return StartupTimes(imports=self._imports, total=total, **self._seconds)
