"""The two generation endpoints: one engine request per choice (a completion may carry several prompts, and
each prompt gets `n` choices), streamed (SSE) or collected."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from graphpool.server.anthropic import MessagesRequest, messages_param
from graphpool.server.anthropic import chat_request as messages_chat_request
from graphpool.server.anthropic_items import MessageWriter
from graphpool.server.async_engine import AsyncEngine, EngineDeadError, RequestStream
from graphpool.server.choices import Choices, sse
from graphpool.server.logprobs import LogprobFormatter, prompt_ask
from graphpool.server.metrics import ServerMetrics
from graphpool.server.parsing import validate
from graphpool.server.prompts import ChatPlan, EngineInput, PromptBuilder
from graphpool.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from graphpool.server.reply_writer import ReplyWriter
from graphpool.server.response_items import ResponseWriter
from graphpool.server.responses import ResponsesRequest, chat_request, new_id, responses_param

DISCONNECT_POLL_S = 0.1


class AbortingStreamingResponse(StreamingResponse):
    """Aborts the engine requests when the response ends before they finished (client gone)."""

    def __init__(
        self, content: AsyncIterator[str], engine: AsyncEngine, streams: list[RequestStream]
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._engine = engine
        self._streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # NOTE: covers a disconnect before the body iterator even started, and cancellation mid-stream.
            _abort_unfinished(self._engine, self._streams)


def _abort_unfinished(engine: AsyncEngine, streams: list[RequestStream]) -> None:
    for stream in streams:
        if not stream.finished:
            engine.abort(stream.request_id)


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Any]]:
    """(choice index, output) from all streams as they come, until every stream has finished."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as e:  # NOTE: re-raised by the reader below
            queue.put_nowait((index, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            remaining -= item.finished
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


class _Timer:
    """Time to first token (of any choice) and request time (until the last choice finished)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.first_token = False
        self.unfinished = 1

    def on_output(self, num_tokens: int, finished: bool) -> None:
        if not self.first_token and num_tokens > 0:
            self.first_token = True
            self.metrics.time_to_first_token.observe(time.perf_counter() - self.start)
        self.unfinished -= finished
        if finished and self.unfinished == 0:
            self.metrics.request_seconds.observe(time.perf_counter() - self.start)


class OpenAIServing:
    def __init__(
        self, engine: AsyncEngine, builder: PromptBuilder, metrics: ServerMetrics, model_name: str
    ) -> None:
        self.engine = engine
        self.builder = builder
        self.metrics = metrics
        self.model_name = model_name
        self.logprobs = LogprobFormatter(builder.tokenizer)

    async def completions(self, req: CompletionRequest, raw: Request) -> Response:
        timer = _Timer(self.metrics)
        # NOTE: tokenizing and templating run off the event loop: a long prompt must not stall other streams.
        inputs = await asyncio.to_thread(self.builder.completion, req)
        return await self._serve(req, inputs, raw, timer, chat=False)

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Response:
        timer = _Timer(self.metrics)
        inputs, plan = await asyncio.to_thread(self.builder.chat, req)
        return await self._serve(req, inputs, raw, timer, chat=True, plan=plan)

    async def responses(self, req: ResponsesRequest, raw: Request) -> Response:
        """The Responses API over the chat path (server/responses.py); its refusals name the Responses fields."""
        response_id = new_id("resp")
        writer = ResponseWriter(response_id, req.model or self.model_name, req)
        return await self.reply(lambda: chat_request(req), writer, response_id, raw, responses_param)

    async def messages(self, req: MessagesRequest, raw: Request) -> Response:
        """Anthropic's Messages API over the chat path (server/anthropic.py)."""
        message_id = new_id("msg")
        writer = MessageWriter(message_id, req.model or self.model_name)
        reasoning = self.builder.reasoning is not None
        return await self.reply(lambda: messages_chat_request(req, reasoning), writer, message_id, raw,
                                messages_param)

    async def reply(self, chat_body: Callable[[], dict[str, Any]], writer: ReplyWriter, request_id: str,
                    raw: Request, param: Callable[[str | None], str | None]) -> Response:
        """One chat reply in another API's shape (the Responses API, Anthropic's Messages API): `chat_body` builds
        the chat request's body (its own refusals named as that API spells them), `writer` turns the reply's parts
        into that API's response or stream events, `param` renames what the chat path refuses."""
        timer = _Timer(self.metrics)
        body = chat_body()
        try:
            req = validate(ChatCompletionRequest, body)
            inputs, plan = await asyncio.to_thread(self.builder.chat, req)
            streams = await self._add(request_id, inputs, chat=True, n=1)
        except APIError as e:
            raise APIError(e.message, param=param(e.param), code=e.code, status_code=e.status_code,
                           type=e.type) from None
        choices = Choices(True, {}, 1, None, plan=plan)
        if req.stream:
            return AbortingStreamingResponse(self._reply_events(streams[0], choices, writer, timer), self.engine,
                                             streams)
        lasts = await self._collect(streams, raw, timer)
        if lasts is None:
            return Response(status_code=499)
        chat = choices.response(lasts, [None])
        message = chat["choices"][0]["message"]
        writer.text("reasoning", message.get("reasoning") or "")
        writer.text("message", message.get("content") or "")
        writer.calls(message.get("tool_calls") or [])
        return JSONResponse(writer.finish(lasts[0], chat["usage"])[1])

    async def _reply_events(self, stream: RequestStream, choices: Choices, writer: ReplyWriter,
                            timer: _Timer) -> AsyncIterator[str]:
        for event in writer.start():
            yield event
        last = None
        try:
            async for out in stream:
                timer.on_output(len(out.token_ids), out.finished)
                for body in choices.chat_bodies(0, out)[0]:
                    for event in (writer.text("reasoning", body.get("reasoning", ""))
                                  + writer.text("message", body.get("content", ""))
                                  + writer.calls(body.get("tool_calls", []))):
                        yield event
                last = out
        except EngineDeadError as e:
            yield writer.error(str(e))
            return
        assert last is not None and last.finished
        for event in writer.finish(last, choices.usage([last]))[0]:
            yield event

    async def _add(self, request_id: str, inputs: list[EngineInput], chat: bool, n: int) -> list[RequestStream]:
        ids = [request_id if len(inputs) == 1 else f"{request_id}-{i}" for i in range(len(inputs))]
        results = await self.engine.add_requests([(rid, inp.prompt, inp.params) for rid, inp in zip(ids, inputs,
                                                                                                   strict=True)])
        streams = [r for r in results if isinstance(r, RequestStream)]
        refused = next(((i, r) for i, r in enumerate(results) if isinstance(r, ValueError)), None)
        if refused is None:
            return streams
        _abort_unfinished(self.engine, streams)
        index, error = refused
        param = getattr(error, "param", None)
        if param == "prompt":
            param = "messages" if chat else (f"prompt[{index // n}]" if len(inputs) > n else "prompt")
        raise APIError(str(error), param=param) from None

    async def _serve(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        inputs: list[EngineInput],
        raw: Request,
        timer: _Timer,
        chat: bool,
        plan: ChatPlan | None = None,
    ) -> Response:
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        n = req.n or 1
        streams = await self._add(request_id, inputs, chat, n)
        timer.unfinished = len(streams)
        header = {"id": request_id, "created": int(time.time()), "model": req.model or self.model_name}
        echo = isinstance(req, CompletionRequest) and req.echo
        echoes = [inp.prompt_text if echo else None for inp in inputs]
        formatter = self.logprobs.naming_ids() if req.return_tokens_as_token_ids else self.logprobs
        logprobs = formatter if inputs[0].params.logprobs is not None else None
        prompt = prompt_ask(req)
        include_usage = req.stream and req.stream_options is not None and req.stream_options.include_usage
        choices = Choices(chat, header, n, logprobs, include_usage, plan, prompt, formatter)
        if include_usage and req.stream_options.continuous_usage_stats:  # type: ignore[union-attr]
            choices.count_continuously(sum(inp.num_prompt_tokens for inp in inputs[::n]))
        if req.stream:
            return AbortingStreamingResponse(self._stream_body(streams, choices, timer, echoes), self.engine, streams)
        lasts = await self._collect(streams, raw, timer)
        if lasts is None:  # client disconnected; nobody reads this
            return Response(status_code=499)
        return JSONResponse(choices.response(lasts, echoes))

    async def _collect(self, streams: list[RequestStream], raw: Request, timer: _Timer) -> list[Any] | None:
        async def collect() -> list[Any]:
            lasts: list[Any] = [None] * len(streams)
            async for index, out in merged(streams):
                timer.on_output(len(out.token_ids), out.finished)
                lasts[index] = out
            return lasts

        task = asyncio.ensure_future(collect())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    try:
                        return task.result()
                    except EngineDeadError as e:
                        raise APIError(str(e), status_code=503, type="server_error") from None
                if await raw.is_disconnected():
                    return None
        finally:
            if not task.done():
                task.cancel()
            _abort_unfinished(self.engine, streams)

    async def _stream_body(
        self, streams: list[RequestStream], choices: Choices, timer: _Timer, echoes: list[str | None]
    ) -> AsyncIterator[str]:
        if choices.chat:
            for index in range(len(streams)):
                yield choices.chunk(index, None, role=True)
        # NOTE: with the prompt's logprobs asked, a choice's echo goes out with its first output, which has them
        waiting: dict[int, str] = {}
        for index, echo in enumerate(echoes):
            if echo is not None and choices.echo_waits:
                waiting[index] = echo
            elif echo:
                yield choices.chunk(index, echo)
        lasts: list[Any] = [None] * len(streams)
        try:
            async for index, out in merged(streams):
                timer.on_output(len(out.token_ids), out.finished)
                choices.observe(index, out)
                if index in waiting:
                    yield choices.echo_chunk(index, waiting.pop(index), out)
                if choices.chat:
                    for chunk in choices.chat_chunks(index, out):
                        yield chunk
                    lasts[index] = out
                    continue
                # NOTE: a chunk per step that made tokens, text or not (a tokenizer-less model makes no text).
                if out.delta_text or out.new_token_ids:
                    yield choices.chunk(index, out.delta_text, out=out)
                if out.finished:
                    yield choices.chunk(index, None, out.finish_reason, stop_reason=out.stop_reason)
                lasts[index] = out
        except EngineDeadError as e:
            yield sse(error_body(str(e), type="server_error"))
            yield sse("[DONE]")
            return
        assert all(last is not None and last.finished for last in lasts)
        if choices.extra:
            yield choices.usage_chunk(lasts)
        yield sse("[DONE]")
