"""What every tool-call format shares: a call, a parsed answer, and the parser interface (`ToolParser`); the
formats themselves are in tool_parsers.py and tool_parser_xml.py."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
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


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
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
    supports_strict: ClassVar[bool] = True  # its calls hold a JSON arguments object (`call_tag`)
    template_signs: ClassVar[tuple[str, ...]] = ()  # text only its chat templates write (`auto` picks it first)

    def for_tools(self, tools: Sequence[dict[str, Any]]) -> ToolParser:
        """The parser for a request offering `tools` (chat's tool dicts): itself, unless the format needs the
        tools' schemas to read arguments."""
        return self

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


class TaggedCallParser(ToolParser):
    """Calls in `<tool_call>...</tool_call>` blocks (Hermes' JSON, Qwen3-Coder's XML): `block_call` reads one block's
    body; a last block the answer ended in without its closing tag counts when its body is whole."""

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
            pos = len(section) if end < 0 else end + len(self._END)
            call = self.block_call(section[body_at:] if end < 0 else section[body_at:end])
            if call is None:
                outside.append(section[begin:pos])
            else:
                calls.append(call)
        outside.append(section[pos:])
        return calls, "".join(outside)

    @abstractmethod
    def block_call(self, body: str) -> ToolCall | None:
        """The call one block holds (None: malformed, its text stays content)."""
