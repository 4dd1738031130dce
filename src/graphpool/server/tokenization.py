"""vLLM's utility routes: /ping, /version, /tokenize (a prompt or chat messages -> token ids) and /detokenize
(token ids -> text), with vLLM's request and response shapes."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.requests import Request
from starlette.responses import Response

from graphpool.server.parsing import body_schema, read_json, validate
from graphpool.server.prompts import PromptBuilder
from graphpool.server.protocol import (
    UNHONOURED_FIELDS,
    APIError,
    ChatMessage,
    ChatRenderFields,
    FunctionTool,
    refuse_unhonoured,
)
from graphpool.server.tools import plan_tools


class TokenizeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(ChatRenderFields):
    """Other fields land in ``model_extra``: those this server cannot honour are refused by name (it renders
    only its own template); `tools` and `tool_choice` render as in a chat completion."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: StrictBool = False  # NOTE: vLLM's default for chat: the template holds them
    return_token_strs: StrictBool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None  # "none": the tools stay out of the prompt, as in a chat completion


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


def add_utility_routes(app: FastAPI, builder: PromptBuilder, version: str, max_request_bytes: int) -> None:
    """Registers /ping, /version, /tokenize and /detokenize on `app` (none of them touches the engine)."""

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def server_version() -> dict[str, str]:
        return {"version": version}

    # NOTE: one route for both request kinds, told apart by `messages` as vLLM's union of the two does.
    @app.post("/tokenize", openapi_extra=body_schema(TokenizeCompletionRequest))
    async def tokenize(raw: Request) -> dict[str, Any]:
        data = await read_json(raw, max_request_bytes)
        req: TokenizeChatRequest | TokenizeCompletionRequest = (
            validate(TokenizeChatRequest, data) if "messages" in data else validate(TokenizeCompletionRequest, data)
        )
        builder.check_model(req.model)
        # NOTE: off the event loop: a long prompt must not stall the streams of other requests.
        ids = await asyncio.to_thread(_token_ids, builder, req)
        strs = builder.tokenizer.token_strs(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": builder.max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize(raw: Request) -> dict[str, str]:
        req = validate(DetokenizeRequest, await read_json(raw, max_request_bytes))
        builder.check_model(req.model)
        tok = builder.need_tokenizer("tokens")
        vocab = tok.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(f"tokens holds ids outside the vocabulary [0, {vocab}): {bad[:8]}", param="tokens")
        return {"prompt": await asyncio.to_thread(tok.decode, req.tokens)}


def _token_ids(builder: PromptBuilder, req: TokenizeChatRequest | TokenizeCompletionRequest) -> list[int]:
    if isinstance(req, TokenizeCompletionRequest):
        return builder.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    refuse_unhonoured(req.model_extra, UNHONOURED_FIELDS)
    plan = plan_tools(req.tools, req.tool_choice, None, builder.parser)
    messages = builder.chat_messages(req.messages, req.tools)
    return builder.render_chat(messages, req, add_special_tokens=req.add_special_tokens, tools=plan.prompt_tools)

