"""Tool-call parsers: the text a model writes when it calls tools, in its family's format, as OpenAI tool calls.

Formats: `hermes` (Hermes / Qwen2 / Qwen3, and the fallback prompt: `<tool_call>{"name", "arguments"}</tool_call>`
blocks), `llama3_json` (Llama 3.x: `{"name", "parameters"}` objects, optionally after `<|python_tag|>`,
several separated by `;`) and `mistral` (`[TOOL_CALLS][{"name", "arguments"}, ...]`, or the newer
`[TOOL_CALLS]name[ARGS]{...}`). A parser only returns calls whose JSON is complete and well formed; anything
else stays in the content, so a model that writes something malformed is answered with what it wrote.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, ClassVar

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class Parsed:
    content: str  # the text outside the calls
    calls: tuple[ToolCall, ...]


def make_call(name: Any, arguments: Any) -> ToolCall | None:
    """A call from a decoded name and arguments (an object, or JSON text of one); None when malformed."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` (after whitespace) and the index after it; None if it is not complete."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


_HOLE = {"\u2063": 0}  # stands for the arguments in `call_tag` (an invisible separator: no name holds it)


class ToolParser(ABC):
    """One format. `start` finds where the calls begin (a stream holds back the text from there), `parse` reads
    a section that begins there: with `final` False, a call still being written is neither a call nor content."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]
    # the marker is a special token the detokenizer would drop: the server keeps special tokens' text
    keep_special_tokens: ClassVar[bool] = False
    call_trigger: ClassVar[str]  # what every call `write_call` writes begins with (strict tools' structural tag)

    def start(self, text: str, pos: int = 0) -> int | None:
        """Where the first call begins (searching from `pos`: a stream knows no marker ends before it)."""
        found = [i for i in (text.find(m, pos) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def holdback(self, text: str) -> int:
        """How many trailing characters of `text` (no marker in it) could be the beginning of a marker."""
        longest = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), longest, -1):
                if text.endswith(m[:k]):
                    longest = k
                    break
        return longest

    def parse(self, text: str, final: bool = True) -> Parsed:
        start = self.start(text)
        if start is None:
            return Parsed(text if final else "", ())
        calls, rest = self.parse_section(text[start:], final)
        return Parsed(text[:start] + rest, tuple(calls))

    @abstractmethod
    def parse_section(self, section: str, final: bool) -> tuple[list[ToolCall], str]:
        """The calls of a section that begins at a marker, and its text outside them."""

    @abstractmethod
    def instructions(self) -> str:
        """The output format, for the system prompt of a chat template that cannot render tools itself."""

    @abstractmethod
    def write_call(self, name: str, arguments: dict[str, Any]) -> str:
        """An earlier call as the model would have written it (for that same prompt)."""

    def history_call_id(self, call_id: str) -> str:
        """A history tool-call id as this family's chat template accepts it."""
        return call_id

    def call_tag(self, name: str) -> tuple[str, str]:
        """The text `write_call` puts before and after a call's arguments object."""
        hole = json.dumps(_HOLE, ensure_ascii=False)
        text = self.write_call(name, _HOLE)
        at = text.index(hole)
        return text[:at], text[at + len(hole):]


class HermesParser(ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)
    call_trigger = "<tool_call>"
    _END = "</tool_call>"

    def parse_section(self, section: str, final: bool) -> tuple[list[ToolCall], str]:
        calls: list[ToolCall] = []
        outside: list[str] = []
        pos = 0
        while (begin := section.find(self.markers[0], pos)) >= 0:
            outside.append(section[pos:begin])
            body_at = begin + len(self.markers[0])
            end = section.find(self._END, body_at)
            if end < 0 and not final:
                return calls, "".join(outside)
            body = section[body_at:] if end < 0 else section[body_at:end]
            pos = len(section) if end < 0 else end + len(self._END)
            call = _hermes_call(body)
            if call is None:
                outside.append(section[begin:pos])
            else:
                calls.append(call)
        outside.append(section[pos:])
        return calls, "".join(outside)

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
            decoded = _decode_at(section, pos)
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
            decoded = _decode_at(text, pos)
            if decoded is None or not isinstance(decoded[0], list) or not decoded[0]:
                return None
            items = [make_call(c.get("name"), c.get("arguments", c.get("parameters")))
                     if isinstance(c, dict) else None for c in decoded[0]]
            return (None if None in items else ([c for c in items if c is not None], decoded[1]))
        # the newer format: name[ARGS]{...}
        args_at = text.find(self._ARGS, pos)
        if args_at < 0:
            return None
        decoded = _decode_at(text, args_at + len(self._ARGS))
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


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}
PARSER_NAMES = ("auto", *PARSERS)


def choose_parser(name: str, template: str | None, vocab: Collection[str], template_has_tools: bool) -> ToolParser:
    """The parser `--tool-call-parser` names; `auto`: the format the chat template writes calls in, else the one
    its vocabulary's markers show, else Hermes (the fallback prompt's format). A ValueError for an unknown name."""
    if name != "auto":
        if name not in PARSERS:
            raise ValueError(f"--tool-call-parser: unknown parser {name!r}; choose one of {list(PARSER_NAMES)}")
        return PARSERS[name]()
    if template and template_has_tools:
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
