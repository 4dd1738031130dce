"""Start-up and shutdown of the server process: the port taken before the model loads, the ready time, and a
bounded graceful shutdown on SIGTERM / SIGINT on top of uvicorn's own.

Shutdown, first signal: new generation requests get a 503 (``/health`` too), running requests go on for up
to ``shutdown_timeout`` seconds, what is left is ended with finish_reason "abort" (a stream gets its final
chunk and ``data: [DONE]``), then uvicorn's own shutdown runs (listener closed, connections finished, lifespan
stops the engine loop) and the process exits 0. Second signal: the process exits at once (128 + signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

from graphpool.engine.startup import seconds_since_process_start
from graphpool.pool.gc_control import collect_and_freeze, gc_paused

__all__ = ["GracefulServer", "PortInUseError", "bind_socket", "seconds_since_process_start"]

logger = logging.getLogger("graphpool.server")

# NOTE: what may still run after the drain: uvicorn writing the last chunks, and the step in flight.
FINISH_WRITES_S = 2.0
STEP_GRACE_S = 5.0


class PortInUseError(OSError):
    """The address to listen on is taken (or not ours to take)."""


@contextlib.contextmanager
def startup_heap() -> Iterator[None]:
    """The cyclic collector off while the engine is built, then one collection and every live object frozen.

    Start-up makes the model's, tokenizer's and libraries' objects once and they live as long as the server
    (about 200k on the default model); a full collection walks all of them (~0.1 s on a 2-core machine), and
    an unfrozen heap pays that whenever serving's own survivors trigger one, mid-stream. Frozen, collections
    walk only what serving made. On an error the collector is as it was and nothing is frozen."""
    with gc_paused():
        yield
    collect_and_freeze()


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not listening yet, so nobody connects before the model has loaded)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise PortInUseError(f"cannot resolve --host {host!r}: {e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    # NOTE: SO_REUSEADDR on Linux only lets a port in TIME_WAIT be reused; a live listener still refuses.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise PortInUseError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; is another server running there? "
            "Pick another port with --port"
        ) from None
    return sock


class GracefulServer(uvicorn.Server):
    """A uvicorn.Server whose first SIGINT/SIGTERM drains the engine (bounded) before uvicorn's shutdown.

    uvicorn's own handler would close the listener at once and wait for every open stream without bound
    (``timeout_graceful_shutdown`` then cancels the handlers, cutting streams mid-body), and a second SIGTERM
    would do nothing; ``handle_exit`` is the hook uvicorn installs for both signals, so it is replaced here.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        engine: Any,
        shutdown_timeout: float,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        if shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {shutdown_timeout}")
        config.timeout_graceful_shutdown = FINISH_WRITES_S
        super().__init__(config)
        self.engine = engine  # an AsyncEngine
        self.shutdown_timeout = shutdown_timeout
        self.on_ready = on_ready
        self.signals_received = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals_received += 1
        if self.signals_received > 1:
            # NOTE: os.write, not logging: this runs in a signal handler, possibly inside a logging call.
            os.write(2, f"graphpool.server: second {signal.Signals(sig).name}: exiting now\n".encode())
            os._exit(128 + sig)
        logger.info(
            "%s: shutting down; new requests get 503, running ones have %.1f s to finish (a second signal "
            "exits at once)",
            signal.Signals(sig).name,
            self.shutdown_timeout,
        )
        self.begin_shutdown()

    def begin_shutdown(self) -> None:
        """The first signal's graceful shutdown, callable from any thread (tests, embedding programs)."""
        # NOTE: refused at once, not when the loop next runs the drain: a request already on its way after this
        # returns must get its 503
        self.engine.stop_accepting()
        if self._loop is None:  # not started yet: nothing to drain
            self.should_exit = True
            return
        try:
            self._loop.call_soon_threadsafe(self._start_drain)
        except RuntimeError:  # the loop has closed: the server already stopped
            self.should_exit = True

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        start = time.monotonic()
        try:
            aborted = await asyncio.wait_for(
                self.engine.drain(self.shutdown_timeout), self.shutdown_timeout + STEP_GRACE_S
            )
            logger.info(
                "drained in %.2f s (%d requests aborted at the %.1f s timeout)",
                time.monotonic() - start,
                aborted,
                self.shutdown_timeout,
            )
        except asyncio.TimeoutError:
            logger.error(
                "the engine step did not return within %.1f s after the shutdown timeout; exiting without it",
                STEP_GRACE_S,
            )
        finally:
            self.should_exit = True
