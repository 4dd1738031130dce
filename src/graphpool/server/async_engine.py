"""The engine loop: one background thread owns the LLMEngine; asyncio handlers talk to it through queues.

NOTE: every call on the engine (add, abort, step, stats) happens on the engine thread. Handlers hand
commands over through a thread-safe queue; outputs come back to each request's asyncio queue through
``loop.call_soon_threadsafe``, one callback per event loop per step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from graphpool.engine.engine import RequestOutput
    from graphpool.engine.sampling import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")
IDLE_WAIT_S = 0.005


class EngineDeadError(RuntimeError):
    """The engine loop stopped (a step raised, or the server is shutting down)."""


class StepObserver(Protocol):
    """Called on the engine thread after each step (metrics)."""

    def on_step(self, engine: Any, outputs: list[RequestOutput]) -> None: ...

    def on_abort(self, request_id: str) -> None: ...


class RequestStream:
    """The outputs of one request, in order; ends after the output with ``finished=True``."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.loop = loop
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    stream: RequestStream
    accepted: asyncio.Future[None]


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future[Any]


@dataclass
class _Stop:
    pass


_Command = _Add | _Abort | _Call | _Stop


def _deliver(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        # NOTE: the loop is closed: nobody is left to read this output.
        logger.debug("event loop closed; dropped a delivery")


def _settle(fut: asyncio.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # the awaiting handler was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class AsyncEngine:
    """Runs ``engine.step()`` in a background thread while requests are unfinished."""

    def __init__(self, engine: Any, observer: StepObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._stopping = False
        # NOTE: once closed (under the lock), no command enters the queue: none can wait unanswered.
        self._lock = threading.Lock()
        self._closed = False

    # ---- lifecycle (any thread) ----
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._thread = threading.Thread(target=self._run, name="graphpool-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._stopping = True
        with self._lock:
            if not self._closed:
                self._commands.put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("engine loop did not stop within %.0f s", timeout)
        self._thread = None

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- handler side (event loop) ----
    async def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams
    ) -> RequestStream:
        """Hands the request to the engine; raises ValueError (the engine's reason) if it was refused."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, loop)
        accepted: asyncio.Future[None] = loop.create_future()
        self._submit(_Add(request_id, prompt, params, stream, accepted))
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Aborts a request and frees its KV blocks (on the engine thread, before its next step)."""
        if self._thread is not None:
            with self._lock:
                if not self._closed:
                    self._commands.put(_Abort(request_id))

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Runs ``fn(engine)`` on the engine thread between two steps."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        self._submit(_Call(fn, loop, result))
        return await result

    def _submit(self, cmd: _Command) -> None:
        with self._lock:
            if self._closed:
                raise EngineDeadError(
                    f"the engine loop stopped: {self.error!r}" if self.error else "the engine loop stopped"
                )
            self._commands.put(cmd)

    def _check_alive(self) -> None:
        if self.error is not None:
            raise EngineDeadError(f"the engine loop stopped after an error: {self.error!r}")
        if self._thread is None or self._stopping or not self._thread.is_alive():
            raise EngineDeadError("the engine loop is not running")

    # ---- engine thread ----
    def _run(self) -> None:
        try:
            device = getattr(self.engine, "device", None)
            if getattr(device, "type", None) == "cuda":
                import torch

                # NOTE: the current device is per thread; lazy captures on this thread use its current stream.
                torch.cuda.set_device(device)
            stalled = False
            while True:
                busy = self.engine.has_unfinished_requests()
                # NOTE: a step that scheduled nothing (unfinished requests, none schedulable) must not spin.
                if not self._drain(block=not busy, timeout=IDLE_WAIT_S if stalled else None):
                    break
                if self.engine.has_unfinished_requests():
                    stalled = not self._step()
        except Exception as e:  # NOTE: not swallowed: logged, and every waiting request gets the error.
            logger.exception("engine loop stopped after an error")
            self.error = e
        finally:
            with self._lock:
                self._closed = True
            if self.error is not None:
                self._fail_all(EngineDeadError(f"engine step failed: {self.error!r}"))
            else:
                self._fail_all(EngineDeadError("the server is shutting down"))

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Applies queued commands (waiting for one if ``block``, or up to ``timeout``); False on stop."""
        cmd: _Command | None = None
        if block:
            cmd = self._commands.get()
        elif timeout is not None:
            try:
                cmd = self._commands.get(timeout=timeout)
            except queue.Empty:
                return True
        while True:
            if cmd is None:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    return True
            if isinstance(cmd, _Stop):
                return False
            self._apply(cmd)
            cmd = None

    def _apply(self, cmd: _Command) -> None:
        if isinstance(cmd, _Add):
            loop = cmd.stream.loop
            if cmd.accepted.done():  # handler already gone
                return
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params)
            except ValueError as e:
                _deliver(loop, _settle, cmd.accepted, None, e)
                return
            self._streams[cmd.request_id] = cmd.stream
            _deliver(loop, _settle, cmd.accepted, None, None)
        elif isinstance(cmd, _Abort):
            stream = self._streams.pop(cmd.request_id, None)
            self.engine.abort_request(cmd.request_id)
            if stream is not None and self.observer is not None:
                self.observer.on_abort(cmd.request_id)
        elif isinstance(cmd, _Call):
            try:
                value = cmd.fn(self.engine)
            except Exception as e:  # NOTE: handed back to the awaiting caller, not swallowed.
                _deliver(cmd.loop, _settle, cmd.result, None, e)
                return
            _deliver(cmd.loop, _settle, cmd.result, value, None)

    def _step(self) -> bool:
        """One engine step; returns whether it produced any output."""
        outputs = self.engine.step()
        if self.observer is not None:
            self.observer.on_step(self.engine, outputs)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            if out.finished:
                del self._streams[out.request_id]
            by_loop.setdefault(stream.loop, []).append((stream, out))
        for loop, items in by_loop.items():
            _deliver(loop, _put_all, items)
        return bool(outputs)

    def _fail_all(self, error: BaseException) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            _deliver(stream.loop, stream._put, error)
        # Commands still queued: refuse adds and calls so that no handler waits forever.
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                _deliver(cmd.stream.loop, _settle, cmd.accepted, None, error)
            elif isinstance(cmd, _Call):
                _deliver(cmd.loop, _settle, cmd.result, None, error)


def _put_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in items:
        stream._put(out)
