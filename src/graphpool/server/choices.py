"""A response's choices in OpenAI's shapes, collected or as stream chunks: text or message, finish reason,
logprobs when asked (the echoed prompt's first), vLLM's prompt_logprobs, and the usage (a prompt counted
once however many choices it has)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from graphpool.engine.outputs import RequestOutput
from graphpool.server.logprobs import LogprobFormatter, PromptAsk
from graphpool.server.reasoning import ReasoningStream
from graphpool.server.tool_stream import ToolCallStream, finish_reason, message

if TYPE_CHECKING:
    from graphpool.server.prompts import ChatPlan


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


class Choices:
    """One response's choices: choice i is the (i // n)-th prompt's (i % n)-th sequence."""

    def __init__(self, chat: bool, header: dict[str, Any], n: int, logprobs: LogprobFormatter | None,
                 include_usage: bool = False, plan: ChatPlan | None = None, prompt: PromptAsk | None = None,
                 formatter: LogprobFormatter | None = None) -> None:
        """`logprobs`: the generated tokens' formatter when they are asked; `plan`: how a chat reply is read
        (tool calls, reasoning); `prompt`: what is asked of the prompt's logprobs, with their `formatter`."""
        self.chat, self.header, self.n, self.logprobs = chat, header, n, logprobs
        self.prompt, self.formatter = (prompt, formatter) if prompt is not None and formatter is not None else (
            None, None)
        # NOTE: with tools to parse, each chat choice's text goes through its own tool-call stream, and with
        # reasoning told apart, through its own reasoning split first
        tools = plan.tools if plan is not None else None
        self.tools = tools if tools is not None and tools.mode != "none" else None
        self.reasoning = plan.reasoning if plan is not None else None
        self._tool_streams: dict[int, ToolCallStream] = {}
        self._reasoning_streams: dict[int, ReasoningStream] = {}
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.extra: dict[str, Any] = {"usage": None} if include_usage else {}
        self._offsets: dict[int, int] = {}  # streamed completions: each choice's text offset so far
        self._running: tuple[int, dict[int, int]] | None = None  # continuous usage: prompt tokens, tokens a choice

    def count_continuously(self, prompt_tokens: int) -> None:
        """Every chunk from now on carries the usage so far (vLLM's continuous_usage_stats)."""
        self._running = (prompt_tokens, {})
        self.extra["usage"] = self._usage_so_far()

    def observe(self, index: int, out: RequestOutput) -> None:
        """A choice's latest output, before its chunks are built (the running usage)."""
        if self._running is not None:
            self._running[1][index] = len(out.token_ids)
            self.extra["usage"] = self._usage_so_far()

    def _usage_so_far(self) -> dict[str, int]:
        assert self._running is not None
        prompt, completion = self._running[0], sum(self._running[1].values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # ---- collected ----
    def response(self, lasts: list[RequestOutput], echoes: list[str | None]) -> dict[str, Any]:
        if self.chat:
            choices = []
            for i, last in enumerate(lasts):
                msg = self._message(last.text)
                choices.append({"index": i, "message": msg, "logprobs": self._logprobs(i, last.logprobs),
                                "finish_reason": finish_reason(last.finish_reason, "tool_calls" in msg),
                                "stop_reason": last.stop_reason})
            # NOTE: vLLM gives a chat response's prompt_logprobs once, beside its choices (one prompt)
            field = self._prompt_field(lasts[0]) if self._asks_field else {}
            return {**self.header, "object": "chat.completion", "choices": choices, "usage": self.usage(lasts),
                    **field}
        choices = []
        for i, (echo, last) in enumerate(zip(echoes, lasts, strict=True)):
            head = self._echo_logprobs(i, last)
            choice = {"index": i, "text": (echo or "") + last.text,
                      "logprobs": _joined(head, self._logprobs(i, last.logprobs)), "finish_reason": last.finish_reason,
                      "stop_reason": last.stop_reason}
            choices.append({**choice, **self._prompt_field(last)} if self._asks_field else choice)
        return {**self.header, "object": "text_completion", "choices": choices, "usage": self.usage(lasts)}

    def _message(self, text: str) -> dict[str, Any]:
        """A collected chat reply's `message`: its reasoning apart (when told apart and asked), then the rest."""
        if self.reasoning is None:
            return message(self.tools, text)
        reasoning, text = self.reasoning.split(text)
        msg = message(self.tools, text)
        if self.reasoning.include:
            msg["reasoning"] = reasoning
        if reasoning is not None and not msg["content"]:
            msg["content"] = None  # a reply that only reasoned (it ended before its answer)
        return msg

    @property
    def _asks_field(self) -> bool:
        return self.prompt is not None and self.prompt.field is not None

    def _prompt_field(self, out: RequestOutput) -> dict[str, Any]:
        """vLLM's `prompt_logprobs` of a request (null when it ended before its prompt ran)."""
        assert self.prompt is not None and self.prompt.field is not None and self.formatter is not None
        lps = out.prompt_logprobs
        return {"prompt_logprobs": None if lps is None else self.formatter.prompt_field(lps, self.prompt.field)}

    def _echo_logprobs(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        """The echoed prompt's logprobs lists (echo with logprobs), from text offset 0; the choice's generated
        tokens continue after them. None when not asked, or when the request ended before its prompt ran."""
        if self.prompt is None or self.prompt.echo is None or out.prompt_logprobs is None:
            return None
        assert self.formatter is not None
        body = self.formatter.echo_completion(out.prompt_token_ids, out.prompt_logprobs, self.prompt.echo)
        self._offsets[index] = body["text_offset"][-1] + len(body["tokens"][-1])
        return body

    def usage(self, lasts: list[RequestOutput]) -> dict[str, Any]:
        """OpenAI's usage: each prompt counted once (its first choice's), with the part of it found in the prefix
        cache (`prompt_tokens_details.cached_tokens`)."""
        prompt = sum(len(out.prompt_token_ids) for out in lasts[:: self.n])
        completion = sum(len(out.token_ids) for out in lasts)
        cached = sum(out.num_cached_tokens for out in lasts[:: self.n])
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    # ---- streamed ----
    def echo_chunk(self, index: int, text: str, out: RequestOutput) -> str:
        """A completion choice's echoed prompt, with the prompt's logprobs from its first output."""
        choice = {"index": index, "text": text, "logprobs": self._echo_logprobs(index, out), "finish_reason": None}
        return sse({**self.header, "object": self.obj, "choices": [choice], **self.extra})

    @property
    def echo_waits(self) -> bool:
        """Whether an echo chunk waits for its choice's first output (which holds the prompt's logprobs)."""
        return self.prompt is not None and self.prompt.echo is not None

    def chunk(self, index: int, text: str | None, finish_reason: str | None = None, role: bool = False,
              out: RequestOutput | None = None, stop_reason: int | str | None = None) -> str:
        """One choice's chunk: `text` (None: none), the logprobs of `out`'s new tokens when asked."""
        logprobs = self._logprobs(index, out.new_logprobs) if out is not None else None
        if self.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            return self._chat_chunk(index, delta, logprobs, finish_reason, stop_reason)
        return self._choice_chunk({"index": index, "text": text or "", "logprobs": logprobs,
                                   "finish_reason": finish_reason}, stop_reason)

    def chat_chunks(self, index: int, out: RequestOutput) -> list[str]:
        """A chat choice's chunks for one output: `chat_bodies`' deltas, the logprobs of its new tokens on the
        first, then its finish chunk when it ended."""
        bodies, finish = self.chat_bodies(index, out)
        logprobs = self._logprobs(index, out.new_logprobs) if out.new_token_ids else None
        if not bodies and logprobs is not None:
            bodies.append({})
        chunks = [self._chat_chunk(index, body, logprobs if k == 0 else None, None) for k, body in enumerate(bodies)]
        if out.finished:
            chunks.append(self._chat_chunk(index, {}, None, finish, out.stop_reason))
        return chunks

    def chat_bodies(self, index: int, out: RequestOutput) -> tuple[list[dict[str, Any]], str | None]:
        """A chat choice's deltas for one output: its reasoning (when told apart and asked), its content and tool
        calls (through the tool-call stream when tools are parsed); and its finish reason once it ended."""
        reasoning, text = self._split(index, out)
        bodies: list[dict[str, Any]] = [{"reasoning": reasoning}] if reasoning else []
        called = False
        if self.tools is None:
            if text or (out.new_token_ids and not bodies):
                bodies.append({"content": text})
        else:
            stream = self._tool_streams.setdefault(index, ToolCallStream(self.tools))
            for delta in [stream.feed(text)] + ([stream.finish()] if out.finished else []):
                if delta:
                    body: dict[str, Any] = {"content": delta.content} if delta.content else {}
                    if delta.calls:
                        body["tool_calls"] = delta.calls
                    bodies.append(body)
            called = stream.called
        return bodies, (finish_reason(out.finish_reason, called) if out.finished else None)

    def _split(self, index: int, out: RequestOutput) -> tuple[str, str]:
        """An output's new (reasoning, content) text: all content unless reasoning is told apart; the reasoning
        left out when not asked."""
        if self.reasoning is None:
            return "", out.delta_text
        stream = self._reasoning_streams.setdefault(index, self.reasoning.stream())
        reasoning, text = stream.feed(out.delta_text)
        if out.finished:
            more = stream.finish()
            reasoning, text = reasoning + more[0], text + more[1]
        return (reasoning if self.reasoning.include else ""), text

    def _chat_chunk(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None,
                    finish: str | None, stop_reason: int | str | None = None) -> str:
        return self._choice_chunk({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish},
                                  stop_reason)

    def _choice_chunk(self, choice: dict[str, Any], stop_reason: int | str | None) -> str:
        """One choice's chunk; a finished one carries its stop_reason."""
        if choice["finish_reason"] is not None:
            choice["stop_reason"] = stop_reason
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


def _joined(head: dict[str, Any] | None, tail: dict[str, Any] | None) -> dict[str, Any] | None:
    """The completions API's logprobs lists of the echoed prompt followed by those of the generated tokens."""
    if head is None or tail is None:
        return tail if head is None else head
    return {key: head[key] + tail[key] for key in head}
