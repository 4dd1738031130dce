"""The FastAPI application: routes, OpenAI-style errors, /health and /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from graphpool.server.async_engine import AsyncEngine, EngineDeadError
from graphpool.server.metrics import ServerMetrics
from graphpool.server.prompts import PromptBuilder
from graphpool.server.protocol import (
    DEFAULT_MAX_REQUEST_BYTES,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
)
from graphpool.server.serving import OpenAIServing

logger = logging.getLogger(__name__)

ENGINE_STOP_TIMEOUT_S = 5.0
M = TypeVar("M", bound=BaseModel)


def build_app(
    engine: AsyncEngine, metrics: ServerMetrics, served_model_name: str | None = None,
    max_request_bytes: int | None = None,
) -> FastAPI:
    """An app serving ``engine`` (an AsyncEngine around an LLMEngine); the lifespan starts and stops its loop.

    ``metrics`` must be the AsyncEngine's observer, so that step histograms and finish reasons are recorded.
    A request body past ``max_request_bytes`` (None: the default) is refused with a 413 before it is parsed.
    """
    if max_request_bytes is None:
        max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    if max_request_bytes < 1:
        raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
    model_name = served_model_name or engine.engine.model_name
    builder = PromptBuilder(engine.engine.tokenizer, engine.engine.max_model_len, [model_name])
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

    def refuse(status: int, body: dict[str, Any]) -> JSONResponse:
        metrics.requests_refused.labels(str(status)).inc()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return refuse(e.status_code, e.body())

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(e.errors())
        return refuse(400, error_body(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return refuse(e.status_code, error_body(str(e.detail)))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return refuse(503, error_body(str(e), type="server_error"))

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
    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(raw: Request) -> Response:
        return await serving.completions(await _parse(raw, CompletionRequest, max_request_bytes), raw)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(raw: Request) -> Response:
        return await serving.chat(await _parse(raw, ChatCompletionRequest, max_request_bytes), raw)

    return app


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"content": schema, "required": True}}


async def _read_body(raw: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to pass `limit` bytes (from Content-Length, or while it
    streams in): a huge body is never held whole."""
    def too_large(size: str) -> APIError:
        return APIError(f"the request body is {size} bytes; this server accepts at most {limit} "
                        "(--max-request-bytes)", code="request_too_large", status_code=413)

    declared = raw.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in raw.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(raw: Request, model: type[M], max_request_bytes: int) -> M:
    body = await _read_body(raw, max_request_bytes)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(f"Invalid JSON body: {e}") from None
    except RecursionError:
        raise APIError("Invalid JSON body: nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = _describe_validation(e.errors())
        raise APIError(message, param=param) from None
    except RecursionError:
        raise APIError("the request body is nested too deeply") from None


def _describe_validation(errors: Any) -> tuple[str, str | None]:
    """FastAPI's 422 details -> one readable message and the offending parameter."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx", {}).get("error", "")
        return f"Invalid JSON body: {ctx}".rstrip(": "), None
    params = [_join_loc([str(p) for p in err.get("loc", ()) if p != "body"]) for err in errors]
    param = params[0] or None
    message = first.get("msg", "invalid value")
    if param:
        message = f"{param}: {message}"
    if len(errors) > 1 and len(set(params)) == 1:  # every branch of a union failed
        message = f"{param}: {str(first.get('input'))[:60]!r} is none of the accepted types"
    elif len(set(params)) > 1:
        message += f" (and {len(set(params)) - 1} more invalid fields)"
    return message, param


def _join_loc(loc: list[str]) -> str:
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif not out:
            out = part
        elif part in ("str", "int", "list[str]", "list[int]", "list[list[int]]") or "[" in part:
            continue  # union-branch names pydantic adds to the location
        else:
            out += f".{part}"
    return out
