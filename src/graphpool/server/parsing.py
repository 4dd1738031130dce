"""Request bodies: read within a byte limit, parsed as JSON whatever the Content-Type, validated into a
pydantic model; every failure is an APIError (a 4xx with an OpenAI-style body), never a 500."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from graphpool.server.protocol import APIError

M = TypeVar("M", bound=BaseModel)


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
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
    try:
        async for chunk in raw.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(f"more than {limit}")
            chunks.append(chunk)
    except ClientDisconnect:
        # NOTE: nobody reads the answer; a 4xx keeps it out of the error log (it is not the server's fault)
        raise APIError(f"the client disconnected after {size} bytes of the body", code="client_disconnected") from None
    return b"".join(chunks)


async def read_json(raw: Request, max_request_bytes: int) -> dict[str, Any]:
    """The body as a JSON object (413 past the limit, 400 for anything else that is not one)."""
    body = await _read_body(raw, max_request_bytes)
    try:
        data = json.loads(body)
    except ValueError as e:  # NOTE: JSONDecodeError, UnicodeDecodeError, an integer past Python's 4300 digits
        raise APIError(f"Invalid JSON body: {e}") from None
    except RecursionError:
        raise APIError("Invalid JSON body: nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = describe_validation(e.errors())
        raise APIError(message, param=param) from None
    except RecursionError:
        raise APIError("the request body is nested too deeply") from None


async def parse_body(raw: Request, model: type[M], max_request_bytes: int) -> M:
    return validate(model, await read_json(raw, max_request_bytes))


def describe_validation(errors: Any) -> tuple[str, str | None]:
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
