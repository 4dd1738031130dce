"""Reasoning apart from the answer (`--reasoning-parser`): a chat reply's text inside `<think>...</think>` goes out
as `message.reasoning` (streamed: `delta.reasoning`), the rest as content (and tool calls), as vLLM's qwen3 and
deepseek_r1 parsers give them.

A reply is reasoning from its start when its prompt leaves a `<think>` open (DeepSeek-R1's and newer Qwen
templates open it in the generation prompt) or when it begins with `<think>` itself (Qwen3), up to its `</think>`;
a reply that ends before one is reasoning alone. A prompt that closed the block (Qwen3 with `enable_thinking:
false`) or never opened one makes a reply of content alone. Whitespace around each part is dropped, streamed or
collected alike (the collected split runs the stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1")
START, END = "<think>", "</think>"  # every parser's markers (vLLM's two names read one format)


@dataclass(frozen=True)
class ReasoningFormat:
    """The server's reasoning markers, each one token of the vocabulary."""

    start_id: int
    end_id: int
    keep_special_tokens: bool  # the markers are special tokens the detokenizer would drop

    def plan(self, prompt_ids: list[int], include: bool) -> ReasoningPlan:
        """How a reply to `prompt_ids` is split: opened when the prompt's last marker is a `<think>`."""
        last = next((t for t in reversed(prompt_ids) if t in (self.start_id, self.end_id)), None)
        return ReasoningPlan(last == self.start_id, include)


def reasoning_format(tokenizer: Any, chat_template: str | None, name: str) -> ReasoningFormat | None:
    """The format `--reasoning-parser` names for this tokenizer (None: replies are content alone). `auto`: the
    `<think>` format when both markers are tokens of the vocabulary and the chat template (--chat-template's,
    else the model's) writes one; a named parser on a vocabulary without them is a ValueError."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser: unknown parser {name!r}; choose one of {list(REASONING_PARSERS)}")
    if name == "none" or (tokenizer is None and name == "auto"):
        return None
    if tokenizer is None:
        raise ValueError(f"--reasoning-parser {name}: this model has no tokenizer, so its replies have no text to split")
    ids = [tokenizer.encode(m, add_special_tokens=False) for m in (START, END)]
    if any(len(i) != 1 for i in ids):
        if name == "auto":
            return None
        raise ValueError(f"--reasoning-parser {name}: this model's vocabulary has no {START} and {END} tokens")
    if name == "auto":
        source_of = getattr(tokenizer, "chat_template_source", None)
        source = (source_of(chat_template) if source_of is not None else chat_template) or ""
        if START not in source and END not in source:
            return None
    dropped = tokenizer.decode(ids[1], skip_special_tokens=True) == ""
    return ReasoningFormat(ids[0][0], ids[1][0], dropped)


@dataclass(frozen=True)
class ReasoningPlan:
    """A request's split: whether its prompt opened the reasoning, and whether the reasoning is sent."""

    opened: bool
    include: bool

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.opened)

    def split(self, text: str) -> tuple[str | None, str]:
        """A collected reply -> (its reasoning, None when it has none; its content)."""
        stream = self.stream()
        r1, c1 = stream.feed(text)
        r2, c2 = stream.finish()
        return r1 + r2 or None, c1 + c2


def _partial(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ReasoningStream:
    """One reply's split as its text comes: `feed` each new text, `finish` at the end; each returns the
    (reasoning, content) to send now, text that could begin a marker or end a part held back."""

    opened: bool
    state: str = field(init=False)  # "before": a <think> may still open the reply; "reasoning"; "content"
    buf: str = ""  # text not sent yet
    lead: bool = True  # the current part has sent nothing yet (its leading whitespace is dropped)

    def __post_init__(self) -> None:
        self.state = "reasoning" if self.opened else "before"

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, str]:
        if self.state == "before":
            head = self.buf.lstrip()
            if head.startswith(START):
                self.buf, self.state = head[len(START):], "reasoning"
            elif not final and START.startswith(head):
                return "", ""  # nothing yet, or what may be the start of <think>
            else:
                self.state, self.lead = "content", False  # a reply without reasoning keeps its text as it is
        reasoning = ""
        if self.state == "reasoning":
            if self.lead:
                head = self.buf.lstrip()
                if head.startswith(START):  # NOTE: a <think> after a prompt that opened one is the same block
                    head = head[len(START):].lstrip()
                elif not final and START.startswith(head):
                    return "", ""
                self.buf = head
            end = self.buf.find(END)
            if end >= 0:
                reasoning, self.buf = self.buf[:end].rstrip(), self.buf[end + len(END):]
                self.state, self.lead = "content", True
            else:
                keep = len(self.buf) if final else len(self.buf) - _partial(self.buf, END)
                reasoning = self.buf[:keep].rstrip()  # NOTE: whitespace before the </think> is no reasoning
                self.buf = self.buf[len(reasoning):]
                self.lead = self.lead and not reasoning
        content = ""
        if self.state == "content":
            if self.lead:
                self.buf = self.buf.lstrip()
            content, self.buf = self.buf, ""
            self.lead = self.lead and not content
        return reasoning, content
