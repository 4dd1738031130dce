"""The FastAPI application: routes, OpenAI-style errors, /health and /metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from graphpool import __version__
from graphpool.server.anthropic import MessagesRequest, anthropic_error
from graphpool.server.async_engine import AsyncEngine, EngineDeadError
from graphpool.server.auth import APIKeyMiddleware
from graphpool.server.chat_options import DEFAULT_CHAT, ChatOptions
from graphpool.server.metrics import ServerMetrics
from graphpool.server.parsing import body_schema, describe_validation, parse_body
from graphpool.server.prompts import PromptBuilder
from graphpool.server.protocol import (
    DEFAULT_MAX_REQUEST_BYTES,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
)
from graphpool.server.responses import ResponsesRequest
from graphpool.server.serving import OpenAIServing
from graphpool.server.tokenization import add_utility_routes

logger = logging.getLogger(__name__)

ENGINE_STOP_TIMEOUT_S = 5.0


def build_app(
    engine: AsyncEngine, metrics: ServerMetrics, served_model_name: str | None = None,
    max_request_bytes: int | None = None, api_keys: Sequence[str] = (), chat: ChatOptions = DEFAULT_CHAT,
) -> FastAPI:
    """An app serving ``engine`` (an AsyncEngine around an LLMEngine); the lifespan starts and stops its loop.

    ``metrics`` must be the AsyncEngine's observer, so that step histograms and finish reasons are recorded.
    A request body past ``max_request_bytes`` (None: the default) is refused with a 413 before it is parsed.
    ``api_keys``: when any, every /v1/* route needs one of them as a Bearer token (else a 401).
    ``chat``: how chats are rendered and read (server/chat_options.py); options the model cannot take (an
    unknown parser, a named one whose markers the vocabulary lacks, template variables its template does not
    read) are a ValueError.
    """
    if max_request_bytes is None:
        max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
    model_name = served_model_name or engine.engine.model_name
    # NOTE: a test's stand-in engine may have no grammars and no sampling defaults
    builder = PromptBuilder(engine.engine.tokenizer, engine.engine.max_model_len, [model_name], chat,
                            getattr(engine.engine, "grammars", None), getattr(engine.engine, "sampling_defaults", None))
    logger.info("chat replies: tool calls read as %s; reasoning %s", builder.parser.name,
                "told apart (<think>...</think>)" if builder.reasoning is not None else "not told apart")
    serving = OpenAIServing(engine, builder, metrics, model_name)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            # NOTE: bounded: a step still running past this is left to the daemon thread (the process exits).
            await asyncio.to_thread(engine.shutdown, ENGINE_STOP_TIMEOUT_S)

    app = FastAPI(title="graphpool", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    if api_keys:
        app.add_middleware(APIKeyMiddleware, keys=list(api_keys),
                           on_refused=lambda: metrics.requests_refused.labels("401").inc())

    def refuse(status: int, body: dict[str, Any]) -> JSONResponse:
        metrics.requests_refused.labels(str(status)).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return refuse(e.status_code, e.body())

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = describe_validation(e.errors())
        return refuse(400, error_body(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return refuse(e.status_code, error_body(str(e.detail)))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return refuse(503, error_body(str(e), type="server_error"))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, e: Exception) -> JSONResponse:
        # NOTE: a bug, not the request's fault: still logged with its traceback (starlette re-raises it after
        # this answer), but answered in OpenAI's shape and counted
        return refuse(500, error_body(f"internal error: {type(e).__name__}: {e}", type="server_error"))

    @app.get("/health")
    async def health() -> Response:
        if engine.draining:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        if engine.is_alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "error", "error": repr(engine.error)}, status_code=503)

    card = {
        "id": model_name,
        "object": "model",
        "created": created,
        "owned_by": "graphpool",
        "max_model_len": builder.max_model_len,
    }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    # NOTE: `:path`, since model names may hold slashes ("org/name"; clients send them unescaped or as %2F).
    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> dict[str, Any]:
        if model_id != model_name:
            raise APIError(
                f"The model `{model_id}` does not exist; this server serves {[model_name]}",
                param="model",
                code="model_not_found",
                status_code=404,
            )
        return card

    # NOTE: renders what the engine thread published after its last step; never waits for a step.
    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # NOTE: exported on the engine thread (the timeline is its own); the device times of the last steps wait
    # for their events there.
    @app.get("/debug/steps")
    async def step_timeline() -> dict[str, Any]:
        if getattr(engine.engine, "timeline", None) is None:
            raise APIError("this server keeps no step timeline: start it with --record-step-timeline",
                           code="not_found", status_code=404)
        return await engine.call(lambda e: e.timeline.export())

    # NOTE: not parsed by FastAPI: JSON whatever the Content-Type (curl -d), the same 400 body for any error.
    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def completions(raw: Request) -> Response:
        return await serving.completions(await parse_body(raw, CompletionRequest, max_request_bytes), raw)

    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def chat_completions(raw: Request) -> Response:
        return await serving.chat(await parse_body(raw, ChatCompletionRequest, max_request_bytes), raw)

    # NOTE: Anthropic's clients read errors in Anthropic's shape
    @app.post("/v1/messages", openapi_extra=body_schema(MessagesRequest))
    async def messages(raw: Request) -> Response:
        try:
            return await serving.messages(await parse_body(raw, MessagesRequest, max_request_bytes), raw)
        except APIError as e:
            return refuse(e.status_code, anthropic_error(e))

    @app.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
    async def responses(raw: Request) -> Response:
        return await serving.responses(await parse_body(raw, ResponsesRequest, max_request_bytes), raw)

    add_utility_routes(app, builder, __version__, max_request_bytes)
    return app
