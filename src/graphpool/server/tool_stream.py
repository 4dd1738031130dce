"""Tool calls in OpenAI's response shapes, collected or streamed.

A stream sends content as it comes until the parser's start marker appears (text that could begin a marker is
held back), then buffers; each call goes out whole, as one `delta.tool_calls` entry (index, id, type, name
and all its arguments), once its text is complete. What is left outside the calls goes out as content at the
end. A forced call is buffered whole and sent at the end.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from graphpool.server.tool_parsers import ToolCall
from graphpool.server.tools import ToolPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_json(call: ToolCall, call_id: str, index: int | None = None) -> dict[str, Any]:
    """One entry of `message.tool_calls` (with `index`: of `delta.tool_calls`)."""
    entry: dict[str, Any] = {} if index is None else {"index": index}
    entry.update({"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
    return entry


def finish_reason(reason: str | None, called: bool) -> str | None:
    """`tool_calls` for an answer that ended by itself after calling tools."""
    return "tool_calls" if called and reason == "stop" else reason


def message(plan: ToolPlan | None, text: str) -> dict[str, Any]:
    """A collected answer's `message`: content (None when only calls), and the calls when there are any."""
    if plan is None or plan.mode == "none":
        return {"role": "assistant", "content": text}
    parsed = plan.result(text)
    content = parsed.content.strip()
    body: dict[str, Any] = {"role": "assistant", "content": content or (None if parsed.calls else content)}
    if parsed.calls:
        body["tool_calls"] = [call_json(c, call_id()) for c in parsed.calls]
    return body


@dataclass
class Delta:
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # `delta.tool_calls` entries

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class ToolCallStream:
    """One choice's stream: `feed` each new text, `finish` at the end; each returns what to send now."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of `text` sent as content
        self.section: int | None = 0 if plan.mode == "forced" else None  # where the calls begin
        self.num_calls = 0

    @property
    def called(self) -> bool:
        return self.num_calls > 0

    def feed(self, delta: str) -> Delta:
        scan_from = max(self.sent - 32, 0)  # NOTE: a marker may straddle the last send; markers are short
        self.text += delta
        if self.section is None:
            start = self.plan.parser.start(self.text, scan_from)
            if start is None:
                keep = len(self.text) - self.plan.parser.holdback(self.text)
                out = Delta(self.text[self.sent:keep])
                self.sent = max(keep, self.sent)
                return out
            self.section = start
            before = self.text[self.sent:self.section]
            self.sent = self.section
            # NOTE: whitespace just before the calls is no answer (the collected content is stripped too)
            return Delta(before if before.strip() else "", self._new_calls(final=False))
        return Delta("", self._new_calls(final=False))

    def finish(self) -> Delta:
        if self.section is None:
            rest = self.text[self.sent:]
            self.sent = len(self.text)
            return Delta(rest)
        calls = self._new_calls(final=True)
        content = self._section_content()
        return Delta(content if content.strip() else "", calls)

    def _parse(self, final: bool) -> tuple[tuple[ToolCall, ...], str]:
        assert self.section is not None
        section = self.text[self.section:]
        if self.plan.mode == "forced":
            if not final:
                return (), ""
            parsed = self.plan.result(section)
            return parsed.calls, parsed.content
        parsed = self.plan.parser.parse_section(section, final)
        calls = tuple(parsed[0]) if self.plan.parallel else tuple(parsed[0][:1])
        return calls, parsed[1]

    def _new_calls(self, final: bool) -> list[dict[str, Any]]:
        calls, _ = self._parse(final)
        new = [call_json(c, call_id(), self.num_calls + k) for k, c in enumerate(calls[self.num_calls:])]
        self.num_calls = len(calls)
        return new

    def _section_content(self) -> str:
        return self._parse(final=True)[1]
