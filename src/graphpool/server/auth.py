"""`--api-key`: every /v1/* route needs `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`); the
others (/health, /ping, /metrics, /version, /tokenize, ...) stay open, as vLLM leaves them."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from graphpool.server.protocol import error_body

PROTECTED_PREFIX = "/v1"


class APIKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware): streamed responses and disconnect polling pass through untouched.

    `on_refused` is called once per refused request (the server counts it on /metrics)."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], on_refused: Callable[[], None] = lambda: None) -> None:
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"API keys must be non-empty strings, got {list(keys)!r}")
        self.app = app
        self._keys = [k.encode() for k in keys]
        self._on_refused = on_refused

    def _allowed(self, header: bytes, api_key: bytes | None) -> bool:
        scheme, _, token = header.partition(b" ")
        if api_key is not None:  # NOTE: Anthropic's clients send the key alone, in x-api-key
            token = api_key
        elif scheme.lower() != b"bearer":
            return False
        token = token.strip()
        # NOTE: compare_digest against every key: the time taken says nothing about which key nearly matched.
        matches = [hmac.compare_digest(token, key) for key in self._keys]
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"")
        if self._allowed(header, headers.get(b"x-api-key")):
            await self.app(scope, receive, send)
            return
        self._on_refused()
        message = ("Incorrect API key provided" if header or b"x-api-key" in headers else
                   "You didn't provide an API key: send it as 'Authorization: Bearer <key>'")
        body = error_body(message, code="invalid_api_key")
        await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


def _protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")
