"""Anthropic's Messages API (`POST /v1/messages`) over the chat path, for clients built on it (the `anthropic`
SDK, Claude Code pointed at a local server): a request becomes a chat completion request (`system` as the system
message; text, tool_use, tool_result and thinking blocks as the conversation; tools, tool_choice and
stop_sequences as their chat forms), its reply content blocks (server/anthropic_items.py). Errors take
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from graphpool.server.foreign import copied, joined_text, named_back
from graphpool.server.protocol import APIError, refuse_unhonoured

# NOTE: Anthropic's error types by status (its SDK raises by status; the type names the kind)
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 503: "overloaded_error"}


class MessagesRequest(BaseModel):
    """Other fields land in ``model_extra``: refused by name unless they change nothing (`metadata`)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None  # a prompt-caching hint: accepted, the prefix cache is automatic


def anthropic_error(e: APIError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(e.status_code, "api_error" if e.status_code >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def chat_request(req: MessagesRequest, reasoning: bool) -> dict[str, Any]:
    """The body of the chat completion request that computes the reply; `reasoning`: whether the server tells a reply's
    reasoning apart (the `thinking` field can only say what the model's template already does)."""
    refuse_unhonoured(req.model_extra)
    kind = (req.thinking or {}).get("type")
    if kind == "enabled" or (kind == "disabled" and reasoning):
        raise APIError("thinking is not supported by this server: whether a model thinks is set by its chat template "
                       "(--default-chat-template-kwargs), and its thinking comes as thinking blocks", param="thinking")
    messages = [{"role": "system", "content": _text(req.system, "system")}] if req.system else []
    for i, message in enumerate(req.messages):
        messages += _messages(i, message)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream,
                            "max_completion_tokens": req.max_tokens, **copied(req, {
                                "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                                "stop": "stop_sequences"})}
    if req.tools is not None:
        body["tools"] = [_chat_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body.update(_chat_tool_choice(req.tool_choice))
    return body


def messages_param(param: str | None) -> str | None:
    """A chat field's name as a Messages request spells it."""
    return named_back(param, {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"}, "messages")


def _text(content: Any, param: str) -> str:
    return joined_text(content, param, ("text",))


def _messages(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Messages message as chat messages: a user's tool results become tool messages (before its text), an
    assistant's tool_use blocks its tool calls and its thinking its reasoning."""
    role, content, param = message.get("role"), message.get("content"), f"messages[{i}]"
    if role not in ("user", "assistant"):
        raise APIError(f"{param}.role must be 'user' or 'assistant', got {role!r}", param=f"{param}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise APIError(f"{param}.content must be a string or a list of blocks", param=f"{param}.content")
    texts, calls, thinking, results = [], [], [], []
    for j, block in enumerate(content):
        kind, where = block.get("type") if isinstance(block, dict) else None, f"{param}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _text(block.get("content", ""), f"{where}.content")})
        else:
            raise APIError(f"{where}: {kind!r} blocks are not supported here (text, tool_use and thinking from the "
                           "assistant, text and tool_result from the user)", param=where)
    if role == "user":
        return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if calls else "")}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["reasoning"] = "".join(thinking)
    return [out]


def _chat_tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    if "input_schema" not in tool or tool.get("type") not in (None, "custom"):
        raise APIError(f"tools[{index}]: only client tools (name, description, input_schema) are supported, got "
                       f"type {tool.get('type')!r}", param=f"tools[{index}]")
    fields = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        fields["description"] = tool["description"]
    return {"type": "function", "function": fields}


def _chat_tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """tool_choice (and disable_parallel_tool_use) as the chat request's fields."""
    kind = choice.get("type")
    forms: dict[str, Any] = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        out: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": choice.get("name")}}}
    elif kind in forms:
        out = {"tool_choice": forms[kind]}
    else:
        raise APIError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", param="tool_choice.type")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out
