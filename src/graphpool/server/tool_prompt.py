"""Tools and tool-call history into the chat template's messages.

A template that renders tools itself (it reads the `tools` variable) gets them as `tools=` and the history as
OpenAI sends it (assistant `tool_calls` with arguments as objects, `tool` messages with their
`tool_call_id`). A template that does not gets the fallback: a system message listing the tools as JSON and
the parser's output format, earlier calls written into the assistant turns as the model would write them,
and tool results as user turns wrapped in `<tool_response></tool_response>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from graphpool.model.chat_render import template_reads
from graphpool.server.protocol import APIError, ChatMessage
from graphpool.server.tool_parsers import ToolParser, choose_parser

FALLBACK_PREAMBLE = ("You can call functions to help answer. The functions you may call are listed below, one "
                     "JSON object each, inside <tools></tools>:")


@dataclass(frozen=True)
class ToolSetup:
    parser: ToolParser
    template_reads_tools: bool
    keep_special_tokens: bool  # the parser's marker is a special token the detokenizer would drop


def tool_setup(tokenizer: Any, chat_template: str | None, parser_name: str) -> ToolSetup:
    """The server's tool-call format for this tokenizer and template (`chat_template`: --chat-template's
    source, None: the model's own); a ValueError for an unknown parser name."""
    source_of = getattr(tokenizer, "chat_template_source", None)
    source = source_of(chat_template, tools=True) if source_of is not None else chat_template
    reads = template_reads(source, "tools")
    has_token = getattr(tokenizer, "has_token", None)
    markers = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]")
    vocab = [m for m in markers if has_token is not None and has_token(m)]
    parser = choose_parser(parser_name, source, vocab, reads)
    keep = parser.keep_special_tokens or any(_dropped_as_special(tokenizer, m) for m in parser.markers if m in vocab)
    return ToolSetup(parser, reads, keep)


def _dropped_as_special(tokenizer: Any, marker: str) -> bool:
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == ""


def history_messages(messages: list[ChatMessage], texts: list[str], parser: ToolParser) -> list[dict[str, Any]]:
    """The messages as a tool-aware template takes them; `texts` are their contents already made text.
    Tool-call history is checked: a 400 naming the field for arguments that are not a JSON object, a tool
    message that answers no earlier call, or tool fields on a role that does not carry them."""
    out: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}  # id -> function name, of the last assistant turn's calls
    for i, (m, text) in enumerate(zip(messages, texts, strict=True)):
        d: dict[str, Any] = {"role": m.role, "content": text}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls is not None and m.role != "assistant":
            raise APIError(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                           param=f"messages[{i}].tool_calls")
        if m.tool_call_id is not None and m.role != "tool":
            raise APIError(f"messages[{i}].tool_call_id: only tool messages carry a tool_call_id",
                           param=f"messages[{i}].tool_call_id")
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None and m.role != "assistant":
            raise APIError(f"messages[{i}].reasoning: only assistant messages carry reasoning",
                           param=f"messages[{i}].reasoning")
        if m.role == "assistant":
            open_calls = {}
            if reasoning is not None:  # NOTE: templates that keep reasoning read this name (chat_render's aliases)
                d["reasoning_content"] = reasoning
            if m.tool_calls:
                d["tool_calls"] = [_call_dict(i, j, c, parser) for j, c in enumerate(m.tool_calls)]
                open_calls = {c.id: c.function.name for c in m.tool_calls}
        elif m.role == "tool":
            if m.tool_call_id is None:
                raise APIError(f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers",
                               param=f"messages[{i}].tool_call_id")
            if m.tool_call_id not in open_calls:
                raise APIError(f"messages[{i}].tool_call_id: {m.tool_call_id!r} answers no tool call of the "
                               "assistant message before it", param=f"messages[{i}].tool_call_id")
            d["tool_call_id"] = parser.history_call_id(m.tool_call_id)
            d.setdefault("name", open_calls[m.tool_call_id])
        else:
            open_calls = {}
        out.append(d)
    return out


def _call_dict(i: int, j: int, call: Any, parser: ToolParser) -> dict[str, Any]:
    param = f"messages[{i}].tool_calls[{j}].function.arguments"
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError as e:
        raise APIError(f"{param}: not JSON ({e})", param=param) from None
    if not isinstance(arguments, dict):
        raise APIError(f"{param}: must be a JSON object, got {type(arguments).__name__}", param=param)
    # NOTE: templates write arguments with `tojson` or iterate over them: they take an object, not JSON text
    return {"id": parser.history_call_id(call.id), "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      parser: ToolParser) -> list[dict[str, str]]:
    """`history_messages`' output for a template that reads no tools: plain role/content messages, with the
    tools (None: none offered) in the system message."""
    out: list[dict[str, str]] = []
    for m in messages:
        if m["role"] == "tool":
            result = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results") == "1":  # NOTE: results of one turn's calls share a user turn
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": "1"})
            continue
        content = m["content"]
        if m.get("tool_calls"):
            written = "\n".join(parser.write_call(c["function"]["name"], c["function"]["arguments"])
                                for c in m["tool_calls"])
            content = f"{content}\n{written}" if content else written
        out.append({"role": m["role"], "content": content})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        block = f"{FALLBACK_PREAMBLE}\n<tools>\n{listing}\n</tools>\n{parser.instructions()}"
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
