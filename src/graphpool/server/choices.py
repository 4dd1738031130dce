"""A response's choices in OpenAI's shapes, collected or as stream chunks: text or message, finish reason,
logprobs when asked, and the usage (a prompt counted once however many choices it has)."""

from __future__ import annotations

import json
from typing import Any

from graphpool.engine.outputs import RequestOutput
from graphpool.server.logprobs import LogprobFormatter
from graphpool.server.tool_stream import ToolCallStream, finish_reason, message
from graphpool.server.tools import ToolPlan


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


class Choices:
    """One response's choices: choice i is the (i // n)-th prompt's (i % n)-th sequence."""

    def __init__(self, chat: bool, header: dict[str, Any], n: int, logprobs: LogprobFormatter | None,
                 include_usage: bool = False, tools: ToolPlan | None = None) -> None:
        self.chat, self.header, self.n, self.logprobs = chat, header, n, logprobs
        # NOTE: with tools to parse, each chat choice's text goes through its own tool-call stream
        self.tools = tools if tools is not None and tools.mode != "none" else None
        self._tool_streams: dict[int, ToolCallStream] = {}
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.extra: dict[str, Any] = {"usage": None} if include_usage else {}
        self._offsets: dict[int, int] = {}  # streamed completions: each choice's text offset so far

    # ---- collected ----
    def response(self, lasts: list[RequestOutput], echoes: list[str | None]) -> dict[str, Any]:
        if self.chat:
            choices = []
            for i, last in enumerate(lasts):
                msg = message(self.tools, last.text)
                choices.append({"index": i, "message": msg, "logprobs": self._logprobs(i, last.logprobs),
                                "finish_reason": finish_reason(last.finish_reason, "tool_calls" in msg)})
            return {**self.header, "object": "chat.completion", "choices": choices, "usage": self.usage(lasts)}
        choices = [
            {"index": i, "text": (echo or "") + last.text, "logprobs": self._logprobs(i, last.logprobs),
             "finish_reason": last.finish_reason}
            for i, (echo, last) in enumerate(zip(echoes, lasts, strict=True))
        ]
        return {**self.header, "object": "text_completion", "choices": choices, "usage": self.usage(lasts)}

    def usage(self, lasts: list[RequestOutput]) -> dict[str, int]:
        prompt = sum(len(out.prompt_token_ids) for out in lasts[:: self.n])
        completion = sum(len(out.token_ids) for out in lasts)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # ---- streamed ----
    def chunk(self, index: int, text: str | None, finish_reason: str | None = None, role: bool = False,
              out: RequestOutput | None = None) -> str:
        """One choice's chunk: `text` (None: none), the logprobs of `out`'s new tokens when asked."""
        logprobs = self._logprobs(index, out.new_logprobs) if out is not None else None
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return sse({**self.header, "object": self.obj, "choices": [choice], **self.extra})

    def chat_chunks(self, index: int, out: RequestOutput) -> list[str]:
        """A chat choice's chunks for one output: its content and tool calls (through the tool-call stream when
        tools are parsed), the logprobs of its new tokens on the first, then its finish chunk when it ended."""
        if self.tools is None:
            chunks = [self.chunk(index, out.delta_text, out=out)] if out.delta_text or out.new_token_ids else []
            return chunks + ([self.chunk(index, None, out.finish_reason)] if out.finished else [])
        stream = self._tool_streams.setdefault(index, ToolCallStream(self.tools))
        deltas = [stream.feed(out.delta_text)] + ([stream.finish()] if out.finished else [])
        chunks = []
        logprobs = self._logprobs(index, out.new_logprobs) if out.new_token_ids else None
        for delta in deltas:
            if delta or logprobs is not None:
                body: dict[str, Any] = {"content": delta.content} if delta.content else {}
                if delta.calls:
                    body["tool_calls"] = delta.calls
                chunks.append(self._chat_chunk(index, body, logprobs, None))
                logprobs = None
        if out.finished:
            chunks.append(self._chat_chunk(index, {}, None, finish_reason(out.finish_reason, stream.called)))
        return chunks

    def _chat_chunk(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None,
                    finish: str | None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse({**self.header, "object": self.obj, "choices": [choice], **self.extra})

    def usage_chunk(self, lasts: list[RequestOutput]) -> str:
        return sse({**self.header, "object": self.obj, "choices": [], "usage": self.usage(lasts)})

    def _logprobs(self, index: int, logprobs: list[Any] | None) -> dict[str, Any] | None:
        if self.logprobs is None or logprobs is None:
            return None
        if self.chat:
            return self.logprobs.chat(logprobs)
        body = self.logprobs.completion(logprobs, self._offsets.get(index, 0))
        if logprobs:
            self._offsets[index] = body["text_offset"][-1] + len(body["tokens"][-1])
        return body
