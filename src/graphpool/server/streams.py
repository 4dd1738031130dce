"""What the engine loop and its handlers exchange: request streams, commands, errors, thread hand-over."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from graphpool.engine.engine import RequestOutput
    from graphpool.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop stopped (a step raised, or the server is shutting down)."""


class ShuttingDownError(EngineDeadError):
    """The server is draining before it exits: running requests go on, new ones are refused."""


class StepObserver(Protocol):
    """Called on the engine thread: after each step, on an abort, and whenever engine state may have moved."""

    def on_step(self, engine: Any, outputs: list[RequestOutput]) -> None: ...

    def on_abort(self, request_id: str) -> None: ...

    def publish(self, engine: Any) -> None: ...


class RequestStream:
    """The outputs of one request, in order; ends after the output with ``finished=True``."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, prompt: str | list[int]) -> None:
        self.request_id = request_id
        self.loop = loop
        self.finished = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._prompt = prompt
        self._last: RequestOutput | None = None  # engine thread only

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def aborted_output(self, encode: Callable[[str], list[int]]) -> RequestOutput:
        """(Engine thread) The request's last output once aborted: all generated so far, finish_reason "abort".

        Text held back as a possible start of a stop string is not sent (as when a client aborts).
        """
        if self._last is not None:
            return dataclasses.replace(
                self._last, new_token_ids=[], delta_text="", finished=True, finish_reason="abort",
                new_logprobs=[] if self._last.new_logprobs is not None else None,
            )
        from graphpool.engine.outputs import RequestOutput

        prompt = self._prompt
        prompt_ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
        return RequestOutput(self.request_id, prompt_ids, [], [], "", "", True, "abort")

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item


@dataclass
class Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    stream: RequestStream
    accepted: asyncio.Future[None]


@dataclass
class Abort:
    request_id: str


@dataclass
class Call:
    fn: Callable[[Any], Any]
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future[Any]


@dataclass
class Drain:
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future[int]  # how many requests were aborted at the deadline


@dataclass
class Stop:
    pass


Command = Add | Abort | Call | Drain | Stop


def deliver(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        # NOTE: the loop is closed: nobody is left to read this output.
        logger.debug("event loop closed; dropped a delivery")


def settle(fut: asyncio.Future[Any], value: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # the awaiting handler was cancelled
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def put_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in items:
        stream._put(out)
