"""The engine thread's side of `AsyncEngine`: it owns the LLMEngine, applies the handlers' commands between
steps, steps while requests are unfinished and hands each step's outputs to their event loops.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graphpool.server.streams import (
    Abort,
    Add,
    Call,
    Command,
    Drain,
    EngineDeadError,
    RequestStream,
    StepObserver,
    Stop,
    deliver,
    put_all,
    settle,
)

if TYPE_CHECKING:
    from graphpool.engine.engine import RequestOutput

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.005


class EngineLoop:
    """What the engine thread runs (`run`); `commands`, `lock`, `closed` and `error` are shared with the
    handler side, every other attribute is the engine thread's alone."""

    def __init__(self, engine: Any, observer: StepObserver | None) -> None:
        self.engine = engine
        self.observer = observer
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        # NOTE: once closed (under the lock), no command enters the queue: none can wait unanswered.
        self.lock = threading.Lock()
        self.closed = False
        self.error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}
        self._drain: Drain | None = None
        self._held: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        device = getattr(engine, "device", None)  # NOTE: test doubles may have none
        self.cuda = device if getattr(device, "type", None) == "cuda" else None
        # NOTE: an engine without the hook (test doubles), or off CUDA, gets its outputs handed out right after
        # its step (the module's note)
        self.hooked = hasattr(engine, "before_wait") and self.cuda is not None
        if self.hooked:
            engine.before_wait = self._flush

    def unhook(self) -> None:
        if self.hooked:
            self.engine.before_wait = None

    def run(self) -> None:
        try:
            device = self.cuda
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
                if not self._apply_commands(block=not busy and not pending,
                                            timeout=IDLE_WAIT_S if stalled else None):
                    break
                if self.engine.has_unfinished_requests():
                    stalled = not self._step()
                    pending = True  # NOTE: a step may have left the pool a size to capture once idle
                    if not self.hooked or not self.engine.has_unfinished_requests():
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
            with self.lock:
                self.closed = True
            if self.error is not None:
                self._fail_all(EngineDeadError(f"engine step failed: {self.error!r}"))
            else:
                self._fail_all(EngineDeadError("the server is shutting down"))

    def _apply_commands(self, block: bool, timeout: float | None = None) -> bool:
        """Applies queued commands (waiting for one if ``block``, or up to ``timeout``); False on stop."""
        cmd: Command | None = None
        if block:
            cmd = self.commands.get()
        elif timeout is not None:
            try:
                cmd = self.commands.get(timeout=timeout)
            except queue.Empty:
                return True
        applied = False
        while True:
            if cmd is None:
                try:
                    cmd = self.commands.get_nowait()
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
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Add):
                deliver(cmd.stream.loop, settle, cmd.accepted, None, error)
            elif isinstance(cmd, Call):
                deliver(cmd.loop, settle, cmd.result, None, error)
            elif isinstance(cmd, Drain):
                deliver(cmd.loop, settle, cmd.result, 0, None)
