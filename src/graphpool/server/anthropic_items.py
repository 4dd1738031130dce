"""An Anthropic Messages reply built from a chat reply's parts as they come: its content blocks (thinking, text,
tool_use) and the stream events that carry them (`message_start`, `content_block_start` / `_delta` / `_stop`,
`message_delta`, `message_stop`). The collected message is built by the same writer."""

from __future__ import annotations

import json
from typing import Any

from graphpool.engine.outputs import RequestOutput
from graphpool.server.reply_writer import ReplyWriter

_BLOCKS = {"reasoning": ("thinking", "thinking_delta"), "message": ("text", "text_delta")}


class MessageWriter(ReplyWriter):
    def __init__(self, message_id: str, model: str) -> None:
        self.head: dict[str, Any] = {"id": message_id, "type": "message", "role": "assistant", "model": model}
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None  # the kind ("reasoning", "message") of the block whose text is still coming

    @staticmethod
    def _event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        message = {**self.head, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [self._event("message_start", message=message)]

    def text(self, kind: str, delta: str) -> list[str]:
        """More of the reasoning (a thinking block) or of the answer (a text block)."""
        if not delta:
            return []
        block_type, delta_type = _BLOCKS[kind]
        events = []
        if self._open != kind:
            events += self._close()
            block: dict[str, Any] = {"type": block_type, block_type: ""}
            if block_type == "thinking":
                block["signature"] = ""  # NOTE: the field Anthropic's thinking blocks carry; nothing is signed here
            self.blocks.append(block)
            self._open = kind
            events.append(self._event("content_block_start", index=len(self.blocks) - 1, content_block=dict(block)))
        self.blocks[-1][block_type] += delta
        return [*events, self._event("content_block_delta", index=len(self.blocks) - 1,
                                     delta={"type": delta_type, block_type: delta})]

    def _call(self, call: dict[str, Any]) -> list[str]:
        """A tool_use block."""
        function = call["function"]
        block = {"type": "tool_use", "id": call["id"], "name": function["name"],
                 "input": json.loads(function["arguments"])}
        self.blocks.append(block)
        index = len(self.blocks) - 1
        return [self._event("content_block_start", index=index, content_block={**block, "input": {}}),
                self._event("content_block_delta", index=index,
                            delta={"type": "input_json_delta", "partial_json": function["arguments"]}),
                self._event("content_block_stop", index=index)]

    def finish(self, last: RequestOutput, usage: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the whole message."""
        events = self._close()
        if any(b["type"] == "tool_use" for b in self.blocks) and last.finish_reason == "stop":
            stop, sequence = "tool_use", None
        elif last.finish_reason == "length":
            stop, sequence = "max_tokens", None
        elif isinstance(last.stop_reason, str):
            stop, sequence = "stop_sequence", last.stop_reason
        else:
            stop, sequence = "end_turn", None
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        counts = {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
                  "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
        message = {**self.head, "content": self.blocks, "stop_reason": stop, "stop_sequence": sequence,
                   "usage": counts}
        events += [self._event("message_delta", delta={"stop_reason": stop, "stop_sequence": sequence}, usage=counts),
                   self._event("message_stop")]
        return events, message

    def error(self, message: str) -> str:
        return self._event("error", error={"type": "api_error", "message": message})

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [self._event("content_block_stop", index=len(self.blocks) - 1)]
