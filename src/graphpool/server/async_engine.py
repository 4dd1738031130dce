"""The engine loop: one background thread owns the LLMEngine; asyncio handlers talk to it through queues.

NOTE: every call on the engine (add, abort, step, stats) happens on the engine thread. Handlers hand
commands over through a thread-safe queue; outputs come back to each request's asyncio queue through
``loop.call_soon_threadsafe``, one callback per event loop per step. After each step (and each batch of
commands) the thread hands the observer the engine to publish a snapshot from, so that readers such as
/metrics never wait for a step.

NOTE: on CUDA a step's outputs are handed out from the next step's `before_wait` hook (LLMEngine), once that
step's device work is enqueued: the event loop then streams them while the engine thread waits for the GPU,
not while it launches the next step (the two threads share one interpreter lock, and a launch that waits for
it leaves the GPU idle). When no step follows at once, and on the CPU (where a step's forward is its own work,
so the hook comes only once the next step is computed), they are handed out right after their own step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

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
    deliver,
    put_all,
    settle,
)

if TYPE_CHECKING:
    from graphpool.engine.engine import RequestOutput
    from graphpool.engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "EngineDeadError", "RequestStream", "ShuttingDownError", "StepObserver"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
IDLE_WAIT_S = 0.005


class AsyncEngine:
    """Runs ``engine.step()`` in a background thread while requests are unfinished."""

    def __init__(self, engine: Any, observer: StepObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._stopping = False
        # NOTE: once closed (under the lock), no command enters the queue: none can wait unanswered.
        self._lock = threading.Lock()
        self._closed = False
        self.draining = False
        self._drain: Drain | None = None  # engine thread only
        self._held: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        device = getattr(engine, "device", None)  # NOTE: test doubles may have none
        self._cuda = device if getattr(device, "type", None) == "cuda" else None
        # NOTE: an engine without the hook (test doubles), or off CUDA, gets its outputs handed out right after
        # its step (the module's note)
        self._hooked = hasattr(engine, "before_wait") and self._cuda is not None
        if self._hooked:
            engine.before_wait = self._flush

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
                self._commands.put(Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(
                "engine loop did not stop within %.1f s (a step still running); leaving it", timeout
            )
        self._thread = None
        if self._hooked:
            self.engine.before_wait = None

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
            with self._lock:
                if not self._closed:
                    self._commands.put(Abort(request_id))

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Runs ``fn(engine)`` on the engine thread between two steps."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        self._submit(Call(fn, loop, result))
        return await result

    def stop_accepting(self) -> None:
        """Refuses new requests from now on (any thread); ``drain`` then ends the running ones."""
        with self._lock:
            self.draining = True

    async def drain(self, timeout: float) -> int:
        """Refuses new requests from now on, lets the running ones finish for up to ``timeout`` seconds, then
        ends the rest with finish_reason "abort" (after the step in flight). Returns how many were aborted."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[int] = loop.create_future()
        with self._lock:
            self.draining = True
            if self._closed or self._thread is None:
                return 0
            # NOTE: queued behind every add submitted before the flag, so none of those is missed.
            self._commands.put(Drain(time.monotonic() + timeout, loop, result))
        return await result

    def _submit(self, cmd: Command) -> None:
        with self._lock:
            if self._closed:
                raise EngineDeadError(
                    f"the engine loop stopped: {self.error!r}" if self.error else "the engine loop stopped"
                )
            if self.draining and isinstance(cmd, Add):
                raise ShuttingDownError("the server is shutting down and accepts no new requests")
            self._commands.put(cmd)

    def _check_alive(self) -> None:
        if self.error is not None:
            raise EngineDeadError(f"the engine loop stopped after an error: {self.error!r}")
        if self.draining:
            raise ShuttingDownError("the server is shutting down and accepts no new requests")
        if self._thread is None or self._stopping or not self._thread.is_alive():
            raise EngineDeadError("the engine loop is not running")

    # ---- engine thread ----
    def _run(self) -> None:
        try:
            device = self._cuda
            if device is not None:
                import torch

                # NOTE: the current device is per thread; lazy captures on this thread use its current stream.
                torch.cuda.set_device(
                    device.index if device.index is not None else torch.cuda.current_device()
                )
            self._publish()
            stalled = False
            # NOTE: an engine's deferred work (LLMEngine.idle_work: warm-up captures, sizes admitted while
            # served padded), one piece each time the loop finds no request unfinished
            idle_work: Callable[[], bool] = getattr(self.engine, "idle_work", lambda: False)
            pending = True
            while True:
                busy = self.engine.has_unfinished_requests()
                # NOTE: a step that scheduled nothing (unfinished requests, none schedulable) must not spin.
                if not self._drain_commands(block=not busy and not pending,
                                            timeout=IDLE_WAIT_S if stalled else None):
                    break
                if self.engine.has_unfinished_requests():
                    stalled = not self._step()
                    pending = True  # NOTE: a step may have left the pool a size to capture once idle
                    if not self._hooked or not self.engine.has_unfinished_requests():
                        self._flush()  # no step follows at once to hand these out
                elif pending:
                    pending = idle_work()
                    self._publish()
                self._check_drain()
        except Exception as e:  # NOTE: not swallowed: logged, and every waiting request gets the error.
            logger.exception("engine loop stopped after an error")
            self.error = e
        finally:
            self._flush()
            with self._lock:
                self._closed = True
            if self.error is not None:
                self._fail_all(EngineDeadError(f"engine step failed: {self.error!r}"))
            else:
                self._fail_all(EngineDeadError("the server is shutting down"))

    def _drain_commands(self, block: bool, timeout: float | None = None) -> bool:
        """Applies queued commands (waiting for one if ``block``, or up to ``timeout``); False on stop."""
        cmd: Command | None = None
        if block:
            cmd = self._commands.get()
        elif timeout is not None:
            try:
                cmd = self._commands.get(timeout=timeout)
            except queue.Empty:
                return True
        applied = False
        while True:
            if cmd is None:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
            if isinstance(cmd, Stop):
                return False
            self._apply(cmd)
            applied = True
            cmd = None
        if applied:
            self._publish()
            self._check_drain()
        return True

    def _apply(self, cmd: Command) -> None:
        if isinstance(cmd, Add):
            loop = cmd.stream.loop
            if cmd.accepted.done():  # handler already gone
                return
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params)
            except ValueError as e:
                deliver(loop, settle, cmd.accepted, None, e)
                return
            self._streams[cmd.request_id] = cmd.stream
            deliver(loop, settle, cmd.accepted, None, None)
        elif isinstance(cmd, Abort):
            stream = self._streams.pop(cmd.request_id, None)
            self.engine.abort_request(cmd.request_id)
            if stream is not None and self.observer is not None:
                self.observer.on_abort(cmd.request_id)
        elif isinstance(cmd, Call):
            try:
                value = cmd.fn(self.engine)
            except Exception as e:  # NOTE: handed back to the awaiting caller, not swallowed.
                deliver(cmd.loop, settle, cmd.result, None, e)
                return
            deliver(cmd.loop, settle, cmd.result, value, None)
        elif isinstance(cmd, Drain):
            self._drain = cmd

    def _step(self) -> bool:
        """One engine step; returns whether it ran one (a middle prefill chunk runs and outputs nothing). Its
        outputs are held for the next step's `before_wait` (the module's note)."""
        outputs = self.engine.step()
        if self.observer is not None:
            self.observer.on_step(self.engine, outputs)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            stream._last = out
            if out.finished:
                del self._streams[out.request_id]
            self._held.setdefault(stream.loop, []).append((stream, out))
        self._publish()
        return self.engine.last_step is not None

    def _flush(self) -> None:
        """Hand the held outputs to their event loops."""
        held, self._held = self._held, {}
        for loop, items in held.items():
            deliver(loop, put_all, items)

    def _check_drain(self) -> None:
        """Answers a pending drain once no request runs, or at its deadline after aborting what is left."""
        drain = self._drain
        if drain is None or (self._streams and time.monotonic() < drain.deadline):
            return
        self._drain = None
        streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            self.engine.abort_request(request_id)
            if self.observer is not None:
                self.observer.on_abort(request_id)
            # NOTE: after any held output of the same stream: each stream's outputs stay in order
            self._held.setdefault(stream.loop, []).append((stream, stream.aborted_output(self.engine.encode)))
        self._flush()
        if streams:
            self._publish()
        deliver(drain.loop, settle, drain.result, len(streams), None)

    def _publish(self) -> None:
        if self.observer is not None:
            self.observer.publish(self.engine)

    def _fail_all(self, error: BaseException) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            deliver(stream.loop, stream._put, error)
        if self._drain is not None:
            deliver(self._drain.loop, settle, self._drain.result, 0, None)
        # Commands still queued: refuse adds and calls so that no handler waits forever.
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Add):
                deliver(cmd.stream.loop, settle, cmd.accepted, None, error)
            elif isinstance(cmd, Call):
                deliver(cmd.loop, settle, cmd.result, None, error)
            elif isinstance(cmd, Drain):
                deliver(cmd.loop, settle, cmd.result, 0, None)
