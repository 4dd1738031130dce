"""The two generation endpoints: one engine request per HTTP request, streamed (SSE) or collected."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from graphpool.server.async_engine import AsyncEngine, EngineDeadError, RequestStream
from graphpool.server.metrics import ServerMetrics
from graphpool.server.prompts import EngineInput, PromptBuilder
from graphpool.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body

DISCONNECT_POLL_S = 0.1


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


class AbortingStreamingResponse(StreamingResponse):
    """Aborts the engine request when the response ends before the request finished (client gone)."""

    def __init__(self, content: AsyncIterator[str], engine: AsyncEngine, stream: RequestStream) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._engine = engine
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # NOTE: covers a disconnect before the body iterator even started, and cancellation mid-stream.
            if not self._stream.finished:
                self._engine.abort(self._stream.request_id)


class _Timer:
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self.first_token = False

    def on_output(self, num_tokens: int, finished: bool) -> None:
        if not self.first_token and num_tokens > 0:
            self.first_token = True
            self.metrics.time_to_first_token.observe(time.perf_counter() - self.start)
        if finished:
            self.metrics.request_seconds.observe(time.perf_counter() - self.start)


class OpenAIServing:
    def __init__(
        self, engine: AsyncEngine, builder: PromptBuilder, metrics: ServerMetrics, model_name: str
    ) -> None:
        self.engine = engine
        self.builder = builder
        self.metrics = metrics
        self.model_name = model_name

    async def completions(self, req: CompletionRequest, raw: Request) -> Response:
        timer = _Timer(self.metrics)
        inp = self.builder.completion(req)
        return await self._serve(req, inp, raw, timer, chat=False)

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Response:
        timer = _Timer(self.metrics)
        inp = self.builder.chat(req)
        return await self._serve(req, inp, raw, timer, chat=True)

    async def _serve(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        inp: EngineInput,
        raw: Request,
        timer: _Timer,
        chat: bool,
    ) -> Response:
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            stream = await self.engine.add_request(request_id, inp.prompt, inp.params)
        except ValueError as e:
            raise APIError(str(e)) from None
        header = {"id": request_id, "created": int(time.time()), "model": req.model or self.model_name}
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            echo = inp.prompt_text if isinstance(req, CompletionRequest) and req.echo else None
            body = self._stream_body(stream, header, timer, chat, echo, include_usage)
            return AbortingStreamingResponse(body, self.engine, stream)
        last = await self._collect(stream, raw, timer)
        if last is None:  # client disconnected; nobody reads this
            return Response(status_code=499)
        usage = _usage(last)
        reason = last.finish_reason
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": last.text},
                "logprobs": None,
                "finish_reason": reason,
            }
            return JSONResponse({**header, "object": "chat.completion", "choices": [choice], "usage": usage})
        text = inp.prompt_text + last.text if isinstance(req, CompletionRequest) and req.echo else last.text
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return JSONResponse({**header, "object": "text_completion", "choices": [choice], "usage": usage})

    async def _collect(self, stream: RequestStream, raw: Request, timer: _Timer) -> Any | None:
        async def collect() -> Any:
            last = None
            async for out in stream:
                timer.on_output(len(out.token_ids), out.finished)
                last = out
            return last

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
            if not stream.finished:
                self.engine.abort(stream.request_id)

    async def _stream_body(
        self,
        stream: RequestStream,
        header: dict[str, Any],
        timer: _Timer,
        chat: bool,
        echo: str | None,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if include_usage else {}

        def chunk(text: str | None, finish_reason: str | None = None, role: bool = False) -> str:
            if chat:
                delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
                if text is not None:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            return sse({**header, "object": obj, "choices": [choice], **extra})

        if chat:
            yield chunk(None, role=True)
        if echo:
            yield chunk(echo)
        last = None
        try:
            async for out in stream:
                timer.on_output(len(out.token_ids), out.finished)
                if out.delta_text:
                    yield chunk(out.delta_text)
                last = out
        except EngineDeadError as e:
            yield sse(error_body(str(e), type="server_error"))
            yield sse("[DONE]")
            return
        assert last is not None and last.finished
        yield chunk(None, last.finish_reason)
        if include_usage:
            yield sse({**header, "object": obj, "choices": [], "usage": _usage(last)})
        yield sse("[DONE]")


def _usage(out: Any) -> dict[str, int]:
    prompt = len(out.prompt_token_ids)
    completion = len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
