"""Tool-call parsers: the text a model writes when it calls tools, in its family's format, as OpenAI tool calls.

Formats: `hermes` (Hermes / Qwen2 / Qwen3, and the fallback prompt: `<tool_call>{"name", "arguments"}</tool_call>`
blocks), `llama3_json` (Llama 3.x: `{"name", "parameters"}` objects, optionally after `<|python_tag|>`,
several separated by `;`), `mistral` (`[TOOL_CALLS][{"name", "arguments"}, ...]`, or the newer
`[TOOL_CALLS]name[ARGS]{...}`) and `qwen3_coder` (XML elements: tool_parser_xml.py). A parser only returns calls whose JSON is complete and well formed; anything
else stays in the content, so a model that writes something malformed is answered with what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from typing import Any

from graphpool.server.tool_parser_base import (
    Parsed,
    TaggedCallParser,
    ToolCall,
    ToolParser,
    decode_at,
    make_call,
)
from graphpool.server.tool_parser_xml import Qwen3CoderParser

__all__ = ["PARSERS", "PARSER_NAMES", "HermesParser", "Llama3JsonParser", "MistralParser", "Parsed",
           "Qwen3CoderParser", "ToolCall", "ToolParser", "choose_parser", "make_call"]


class HermesParser(TaggedCallParser):
    name = "hermes"

    def block_call(self, body: str) -> ToolCall | None:
        return _hermes_call(body)

    def instructions(self) -> str:
        return ("To call a function, answer with one <tool_call></tool_call> block per call, each holding a JSON "
                "object with the function's name and its arguments:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>\n'
                "Each result comes back inside <tool_response></tool_response>.")

    def write_call(self, name: str, arguments: dict[str, Any]) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"


def _hermes_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    return make_call(obj.get("name"), obj.get("arguments", obj.get("parameters")))


class Llama3JsonParser(ToolParser):
    """Llama 3.x's JSON tool calls: the answer is the calls (it begins with `{`, or `<|python_tag|>`)."""

    name = "llama3_json"
    markers = ("<|python_tag|>",)
    call_trigger = '{"name": '

    _LEADING_OBJECT = re.compile(r"\s*\{")

    def start(self, text: str, pos: int = 0) -> int | None:
        leading = self._LEADING_OBJECT.match(text)
        if leading:
            return leading.end() - 1
        return super().start(text, pos)

    def holdback(self, text: str) -> int:
        # NOTE: leading whitespace may still be followed by a call's `{`
        return len(text) if not text.strip() else super().holdback(text)

    def parse_section(self, section: str, final: bool) -> tuple[list[ToolCall], str]:
        pos = len(self.markers[0]) if section.startswith(self.markers[0]) else 0
        calls: list[ToolCall] = []
        while True:
            while pos < len(section) and (section[pos].isspace() or section[pos] == ";"):
                pos += 1
            if pos == len(section):
                return calls, ""
            decoded = decode_at(section, pos)
            if decoded is None:
                return calls, section[pos:] if final else ""
            obj, end = decoded
            call = make_call(obj.get("name"), obj.get("parameters", obj.get("arguments"))) \
                if isinstance(obj, dict) else None
            if call is None:
                return calls, section[pos:]
            calls.append(call)
            pos = end

    def instructions(self) -> str:
        return ("To call functions, answer with nothing but one JSON object per call, separated by ';':\n"
                '{"name": <function-name>, "parameters": <arguments-object>}\n'
                "Each result comes back inside <tool_response></tool_response>.")

    def write_call(self, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)


class MistralParser(ToolParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    call_trigger = "[TOOL_CALLS]"
    keep_special_tokens = True
    _ARGS = "[ARGS]"
    _ID = re.compile(r"[A-Za-z0-9]{9}")

    def parse_section(self, section: str, final: bool) -> tuple[list[ToolCall], str]:
        calls: list[ToolCall] = []
        outside: list[str] = []
        pos = 0
        marker = self.markers[0]
        while section.startswith(marker, pos):
            body_at = pos + len(marker)
            found = self._calls_at(section, body_at)
            if found is None:  # incomplete or malformed: the rest is no call
                if final:
                    outside.append(section[pos:])
                return calls, "".join(outside)
            new, pos = found
            calls += new
            nxt = section.find(marker, pos)
            outside.append(section[pos:] if nxt < 0 else section[pos:nxt])
            pos = len(section) if nxt < 0 else nxt
        return calls, "".join(outside)

    def _calls_at(self, text: str, pos: int) -> tuple[list[ToolCall], int] | None:
        if text[pos:].lstrip().startswith("["):
            decoded = decode_at(text, pos)
            if decoded is None or not isinstance(decoded[0], list) or not decoded[0]:
                return None
            items = [make_call(c.get("name"), c.get("arguments", c.get("parameters")))
                     if isinstance(c, dict) else None for c in decoded[0]]
            return (None if None in items else ([c for c in items if c is not None], decoded[1]))
        # the newer format: name[ARGS]{...}
        args_at = text.find(self._ARGS, pos)
        if args_at < 0:
            return None
        decoded = decode_at(text, args_at + len(self._ARGS))
        call = make_call(text[pos:args_at].strip(), decoded[0]) if decoded is not None else None
        return None if call is None or decoded is None else ([call], decoded[1])

    def instructions(self) -> str:
        return ("To call functions, answer with [TOOL_CALLS] followed by a JSON list of the calls:\n"
                '[TOOL_CALLS][{"name": <function-name>, "arguments": <arguments-object>}]\n'
                "Each result comes back inside <tool_response></tool_response>.")

    def write_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)

    def history_call_id(self, call_id: str) -> str:
        # NOTE: Mistral's templates refuse any id but 9 letters or digits; the same id always maps alike.
        if self._ID.fullmatch(call_id):
            return call_id
        return hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:9]


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser,
                                                             Qwen3CoderParser)}
PARSER_NAMES = ("auto", *PARSERS)


def choose_parser(name: str, template: str | None, vocab: Collection[str], template_has_tools: bool) -> ToolParser:
    """The parser `--tool-call-parser` names; `auto`: the format the chat template writes calls in, else the one
    its vocabulary's markers show, else Hermes (the fallback prompt's format). A ValueError for an unknown name."""
    if name != "auto":
        if name not in PARSERS:
            raise ValueError(f"--tool-call-parser: unknown parser {name!r}; choose one of {list(PARSER_NAMES)}")
        return PARSERS[name]()
    if template and template_has_tools:
        for cls in PARSERS.values():  # NOTE: a format's own sign first (Qwen3-Coder's template also writes <tool_call>)
            if any(sign in template for sign in cls.template_signs):
                return cls()
        for cls in (MistralParser, HermesParser):
            if any(m in template for m in cls.markers):
                return cls()
        if "<|python_tag|>" in template or "ipython" in template:
            return Llama3JsonParser()
    if template_has_tools:
        for cls in (MistralParser, Llama3JsonParser, HermesParser):
            if any(m in vocab for m in cls.markers):
                return cls()
    return HermesParser()
