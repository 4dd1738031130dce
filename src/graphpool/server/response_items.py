"""A Responses API reply built from a chat reply's parts as they come (reasoning text, answer text, whole tool
calls): its output items, and the stream events that announce them (`response.output_item.added`, text deltas,
`...done`), numbered by `sequence_number`. The collected response is built by the same writer, so a stream's
items and the final response agree, ids included."""

from __future__ import annotations

import json
import time
from typing import Any

from graphpool.engine.outputs import RequestOutput
from graphpool.server.reply_writer import ReplyWriter
from graphpool.server.responses import ResponsesRequest, new_id


class ResponseWriter(ReplyWriter):
    """The Responses API's output items and stream events."""
    def __init__(self, response_id: str, model: str, req: ResponsesRequest) -> None:
        self.head: dict[str, Any] = {
            "id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "tools": req.tools or [],
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}}, "metadata": {},
            "error": None, "incomplete_details": None, "usage": None,
        }
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the reasoning or message item whose text is still coming
        self._seq = 0

    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def _response(self, status: str) -> dict[str, Any]:
        return {**self.head, "status": status, "output": self.items if status != "in_progress" else []}

    def start(self) -> list[str]:
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def text(self, kind: str, delta: str) -> list[str]:
        """More of the reasoning (`kind` "reasoning") or of the answer ("message")."""
        if not delta:
            return []
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            events += self._add(kind)
        assert self._open is not None
        part = self._open["content"][0]
        part["text"] += delta
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self._event(name, **self._where(), delta=delta, **extra)]

    def _call(self, call: dict[str, Any]) -> list[str]:
        """A function_call item."""
        function = call["function"]
        item = {"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "name": function["name"],
                "arguments": function["arguments"], "status": "completed"}
        index = len(self.items)
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": index}
        return [self._event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def finish(self, last: RequestOutput, usage: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """The closing events and the whole response: incomplete when the reply ran into max_output_tokens."""
        incomplete = last.finish_reason == "length"
        events = self._close(status="incomplete" if incomplete else "completed")
        if not self.items:  # NOTE: an empty answer is still a message, as OpenAI gives it
            events += self._add("message") + self._close(status="incomplete" if incomplete else "completed")
        self.head["usage"] = {
            "input_tokens": usage["prompt_tokens"], "input_tokens_details": usage["prompt_tokens_details"],
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }
        if incomplete:
            self.head["incomplete_details"] = {"reason": "max_output_tokens"}
        response = self._response("incomplete" if incomplete else "completed")
        kind = "response.incomplete" if incomplete else "response.completed"
        return [*events, self._event(kind, response=response)], response

    def error(self, message: str) -> str:
        body = {"type": "error", "message": message, "code": "server_error"}
        return f"event: error\ndata: {json.dumps(body)}\n\n"

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _add(self, kind: str) -> list[str]:
        if kind == "reasoning":
            item: dict[str, Any] = {"type": "reasoning", "id": new_id("rs"), "summary": [],
                                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        else:
            item = {"type": "message", "id": new_id("msg"), "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        self.items.append(item)
        self._open = item
        index = len(self.items) - 1
        part = dict(item["content"][0])
        return [self._event("response.output_item.added", output_index=index, item={**item, "content": []}),
                self._event("response.content_part.added", **self._where(), part=part)]

    def _close(self, status: str = "completed") -> list[str]:
        """The open item's closing events (its text whole)."""
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        part = item["content"][0]
        index = self.items.index(item)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        done = ("response.reasoning_text.done", {"text": part["text"]}) if item["type"] == "reasoning" else (
            "response.output_text.done", {"text": part["text"], "logprobs": []})
        return [self._event(done[0], **where, **done[1]),
                self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", output_index=index, item=item)]
