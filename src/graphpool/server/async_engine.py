"""The engine loop's handler side: one background thread owns the LLMEngine (`EngineLoop`); asyncio handlers
talk to it through a queue.

NOTE: every call on the engine (add, abort, step, stats) happens on the engine thread. Handlers hand
commands over through a thread-safe queue; outputs come back to each request's asyncio queue through
``loop.call_soon_threadsafe``, one callback per event loop per step. After each step (and each batch of
commands) the thread hands the observer the engine to publish a snapshot from, so that readers such as
/metrics never wait for a step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from graphpool.server.engine_loop import IDLE_WAIT_S, EngineLoop
from graphpool.server.streams import (
    Abort,
    Add,
    Call,
    Command,
    Drain,
    EngineDeadError,
    RequestStream,
    ShuttingDownError,
    StepObserver,
    Stop,
)

if TYPE_CHECKING:
    from graphpool.engine.sampling_params import SamplingParams

__all__ = ["IDLE_WAIT_S", "AsyncEngine", "EngineDeadError", "RequestStream", "ShuttingDownError", "StepObserver"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncEngine:
    """Runs ``engine.step()`` in a background thread while requests are unfinished."""

    def __init__(self, engine: Any, observer: StepObserver | None = None) -> None:
        self.engine = engine
        self._core = EngineLoop(engine, observer)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.draining = False

    @property
    def error(self) -> BaseException | None:
        return self._core.error

    # ---- lifecycle (any thread) ----
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._thread = threading.Thread(target=self._core.run, name="graphpool-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._stopping = True
        self._offer(Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(
                "engine loop did not stop within %.1f s (a step still running); leaving it", timeout
            )
        self._thread = None
        self._core.unhook()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- handler side (event loop) ----
    async def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams
    ) -> RequestStream:
        """Hands the request to the engine; raises ValueError (the engine's reason) if it was refused."""
        result = (await self.add_requests([(request_id, prompt, params)]))[0]
        if isinstance(result, ValueError):
            raise result
        return result

    async def add_requests(
        self, requests: Sequence[tuple[str, str | list[int], SamplingParams]]
    ) -> list[RequestStream | ValueError]:
        """Hands requests to the engine together, so it takes them in one pass between two steps (awaited one
        by one, a request's n choices were admitted one a step); each is its stream or the ValueError it was
        refused with. Cancelled (or any other error): every one of them is aborted."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        streams: list[RequestStream] = []
        try:
            accepted = []
            for request_id, prompt, params in requests:
                streams.append(RequestStream(request_id, loop, prompt))
                accepted.append(loop.create_future())
                self._submit(Add(request_id, prompt, params, streams[-1], accepted[-1]))
            results = await asyncio.gather(*accepted, return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException) and not isinstance(r, ValueError)), None)
            if failed is not None:
                raise failed
        except BaseException:
            for stream in streams:
                self.abort(stream.request_id)
            raise
        return [r if isinstance(r, ValueError) else stream for r, stream in zip(results, streams, strict=True)]

    def abort(self, request_id: str) -> None:
        """Aborts a request and frees its KV blocks (on the engine thread, before its next step)."""
        if self._thread is not None:
            self._offer(Abort(request_id))

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Runs ``fn(engine)`` on the engine thread between two steps."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        self._submit(Call(fn, loop, result))
        return await result

    def stop_accepting(self) -> None:
        """Refuses new requests from now on (any thread); ``drain`` then ends the running ones."""
        with self._core.lock:
            self.draining = True

    async def drain(self, timeout: float) -> int:
        """Refuses new requests from now on, lets the running ones finish for up to ``timeout`` seconds, then
        ends the rest with finish_reason "abort" (after the step in flight). Returns how many were aborted."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[int] = loop.create_future()
        self.stop_accepting()
        # NOTE: queued behind every add submitted before the flag, so none of those is missed.
        if self._thread is None or not self._offer(Drain(time.monotonic() + timeout, loop, result)):
            return 0
        return await result

    def _offer(self, cmd: Command) -> bool:
        """Queues `cmd` unless the loop has closed (then nothing would answer it); whether it was queued."""
        with self._core.lock:
            if self._core.closed:
                return False
            self._core.commands.put(cmd)
            return True

    def _submit(self, cmd: Command) -> None:
        with self._core.lock:
            if self._core.closed:
                raise EngineDeadError(
                    f"the engine loop stopped: {self.error!r}" if self.error else "the engine loop stopped"
                )
            if self.draining and isinstance(cmd, Add):
                raise ShuttingDownError("the server is shutting down and accepts no new requests")
            self._core.commands.put(cmd)

    def _check_alive(self) -> None:
        if self.error is not None:
            raise EngineDeadError(f"the engine loop stopped after an error: {self.error!r}")
        if self.draining:
            raise ShuttingDownError("the server is shutting down and accepts no new requests")
        if self._thread is None or self._stopping or not self._thread.is_alive():
            raise EngineDeadError("the engine loop is not running")
