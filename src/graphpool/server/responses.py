"""OpenAI's Responses API (`POST /v1/responses`) over the chat path: a request becomes a chat completion request
(instructions as the system message; message, function_call, function_call_output and reasoning input items as
the conversation; function tools, tool_choice and text.format as their chat forms), and its reply becomes output
items: a reasoning item (when reasoning is told apart), the message, and one function_call item per call.

What needs state the server does not keep (`previous_response_id`, item references, `truncation: auto`) or that
it cannot honour (`reasoning.effort`, `include`, non-text input) is refused with a 400 naming the field.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from graphpool.server.foreign import copied, joined_text, named_back
from graphpool.server.protocol import APIError, refuse_unhonoured

# Fields of the Responses API that change the output and need what this server does not have, with the value
# that changes nothing.
RESPONSES_UNHONOURED: dict[str, Any] = {
    "previous_response_id": None, "conversation": None, "background": False, "prompt": None,
    "max_tool_calls": None, "top_logprobs": None, "stream_options": None, "context_management": None,
}


class ResponsesRequest(BaseModel):
    """Other fields land in ``model_extra``: refused by name unless they change nothing (`store`, `metadata`)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: StrictBool = False
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    user: str | None = None


def chat_request(req: ResponsesRequest) -> dict[str, Any]:
    """The body of the chat completion request that computes the response (a 400 naming the Responses field
    otherwise)."""
    refuse_unhonoured(req.model_extra, RESPONSES_UNHONOURED)
    if req.include:
        raise APIError(f"include is not supported by this server, got {req.include}", param="include")
    if req.truncation not in (None, "disabled"):
        raise APIError("truncation: only 'disabled' (a conversation past the context is refused)", param="truncation")
    for key, value in (req.reasoning or {}).items():
        if value is not None:
            raise APIError(f"reasoning.{key} is not supported by this server: a model's reasoning is set by its "
                           "chat template (chat_template_kwargs on /v1/chat/completions)", param=f"reasoning.{key}")
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += _conversation(req.input)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream, **copied(req, {
        "temperature": "temperature", "top_p": "top_p", "max_completion_tokens": "max_output_tokens",
        "parallel_tool_calls": "parallel_tool_calls", "user": "user"})}
    if req.tools is not None:
        body["tools"] = [_chat_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        choice = req.tool_choice
        named = isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}} if named else choice
    fmt = (req.text or {}).get("format")
    if fmt is not None:
        body["response_format"] = _chat_format(fmt)
    return body


def responses_param(param: str | None) -> str | None:
    """A chat field's name as the Responses request spells it."""
    return named_back(param, {"max_completion_tokens": "max_output_tokens", "response_format": "text.format"},
                      "input")


def _text(content: Any, param: str) -> str:
    """A message's or a tool output's content as text: a string, or text parts joined."""
    return joined_text(content, param, ("input_text", "output_text", "text", "reasoning_text", "summary_text"))


def _conversation(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items as chat messages: consecutive function calls join one assistant turn, and a reasoning
    item's text goes with the assistant turn after it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = _text(item.get("content") or item.get("summary") or [], f"input[{i}].content")
            continue
        if kind == "message":
            role = item.get("role")
            message: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"input[{i}].content")}
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and reasoning is None:
                last["tool_calls"].append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif kind == "function_call_output":
            message = {"role": "tool", "tool_call_id": item.get("call_id"),
                       "content": _text(item.get("output"), f"input[{i}].output")}
        else:
            raise APIError(f"input[{i}].type: {kind!r} items are not supported by this server (it keeps no earlier "
                           "responses and reads text only)", param=f"input[{i}].type")
        if reasoning is not None:
            if message["role"] != "assistant":
                raise APIError(f"input[{i}]: a reasoning item must come before the assistant message or function "
                               "call it led to", param=f"input[{i}]")
            message["reasoning"], reasoning = reasoning, None
        messages.append(message)
    if reasoning is not None:
        raise APIError("input: a reasoning item must come before the assistant message or function call it led to",
                       param="input")
    return messages


def _chat_tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise APIError(f"tools[{index}].type: only function tools are supported, got {tool.get('type')!r}",
                       param=f"tools[{index}].type")
    fields = {k: v for k, v in tool.items() if k != "type"}
    return {"type": "function", "function": fields}


def _chat_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    if kind in ("text", "json_object"):
        return None if kind == "text" else {"type": "json_object"}
    raise APIError(f"text.format.type must be text, json_object or json_schema, got {kind!r}", param="text.format.type")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
