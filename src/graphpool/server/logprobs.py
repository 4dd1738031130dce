"""The engine's per-token logprobs in OpenAI's response shapes: the completions API's `tokens` /
`token_logprobs` / `top_logprobs` / `text_offset` lists and the chat API's `content` entries; the prompt's
logprobs (`PromptAsk`): leading the completions' lists when `echo` comes with `logprobs` (the first prompt
token's logprob null, as OpenAI and vLLM give it), and vLLM's `prompt_logprobs` field.

Every generated token is listed, a stop token included (usage counts it too), each as its own text decoded
alone with special tokens kept; a tokenizer-less model, or a request with vLLM's `return_tokens_as_token_ids`,
names tokens `token_id:<id>` (vLLM's spelling).
A logprob of -inf is sent as -9999.0 (vLLM's clamp: JSON has no infinity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphpool.engine.llm_outputs import prompt_logprob_dicts
from graphpool.engine.logprobs import TokenLogprob
from graphpool.engine.sampling_params import MAX_LOGPROBS
from graphpool.server.protocol import APIError, ChatCompletionRequest, CompletionRequest

LOGPROB_FLOOR = -9999.0


def check_logprobs(value: int | None, param: str) -> None:
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise APIError(f"{param} must be in [0, {MAX_LOGPROBS}], got {value}", param=param)


@dataclass(frozen=True)
class PromptAsk:
    """What a request asks of its prompt's logprobs: vLLM's `prompt_logprobs` (`field` top tokens), and the
    echoed prompt's logprobs (completions' `echo` with `logprobs`: `echo` top tokens)."""

    field: int | None
    echo: int | None

    @property
    def engine_k(self) -> int | None:
        """SamplingParams.prompt_logprobs: enough top tokens for both (each reply trims to its own)."""
        asked = [k for k in (self.field, self.echo) if k is not None]
        return max(asked) if asked else None


def prompt_ask(req: CompletionRequest | ChatCompletionRequest) -> PromptAsk:
    """The request's `PromptAsk`, checked: `prompt_logprobs` in [0, 20] and not streamed (vLLM refuses that
    too: a stream has no place for them)."""
    check_logprobs(req.prompt_logprobs, "prompt_logprobs")
    if req.prompt_logprobs is not None and req.stream:
        raise APIError("prompt_logprobs cannot be streamed: send it with stream false", param="prompt_logprobs")
    echo = req.logprobs if isinstance(req, CompletionRequest) and req.echo else None
    return PromptAsk(req.prompt_logprobs, echo)


class LogprobFormatter:
    """Turns `TokenLogprob`s into the response fields of either endpoint."""

    def __init__(self, tokenizer: Any, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids  # tokens named `token_id:<id>` (return_tokens_as_token_ids)
        self._texts: dict[int, str] = {}
        self._ids: LogprobFormatter | None = None

    def naming_ids(self) -> LogprobFormatter:
        """The formatter that names every token `token_id:<id>` (its decoded text kept for the chat `bytes`)."""
        if self._ids is None:
            self._ids = LogprobFormatter(self.tokenizer, as_ids=True)
            self._ids._texts = self._texts
        return self._ids

    def decoded(self, token_id: int) -> str:
        """The token's own text (special tokens kept), `token_id:<id>` without a tokenizer."""
        text = self._texts.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def token_text(self, token_id: int) -> str:
        """How a response names the token."""
        return f"token_id:{token_id}" if self.as_ids else self.decoded(token_id)

    def completion(self, logprobs: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """The completions API's `logprobs` object; `offset`: the text offset of the first token (streaming
        continues where the previous chunk ended). Each `top_logprobs` entry holds the top tokens and the
        sampled one (OpenAI: up to `logprobs` + 1 entries)."""
        tokens, values, tops, offsets = [], [], [], []
        for lp in logprobs:
            text = self.token_text(lp.token_id)
            tokens.append(text)
            values.append(max(lp.logprob, LOGPROB_FLOOR))
            top = {self.token_text(t): max(v, LOGPROB_FLOOR) for t, v in lp.top}
            top.setdefault(text, values[-1])
            tops.append(top)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def echo_completion(self, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprob], k: int) -> dict[str, Any]:
        """The completions API's `logprobs` lists over the prompt's tokens, from offset 0: the first token's
        logprob and top_logprobs null, the others with their `k` top tokens."""
        first = self.token_text(prompt_ids[0])
        rest = self.completion([replace(lp, top=lp.top[:k]) for lp in logprobs], len(first))
        return {"tokens": [first, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
                "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}

    def prompt_field(self, logprobs: Sequence[TokenLogprob], k: int) -> list[dict[str, Any] | None]:
        """vLLM's `prompt_logprobs`: null for the first prompt token, then per position its token and the `k`
        most likely ones, id -> {"logprob", "rank", "decoded_token"}."""
        text = self.decoded if self.tokenizer is not None else (lambda _: None)
        return [None if entry is None else
                {str(t): {"logprob": max(v.logprob, LOGPROB_FLOOR), "rank": v.rank, "decoded_token": v.decoded_token}
                 for t, v in entry.items()}
                for entry in prompt_logprob_dicts(logprobs, k, text)]

    def chat(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The chat API's `logprobs` object: one `content` entry per token, with its `top_logprobs`."""
        return {"content": [
            {**self._entry(lp.token_id, lp.logprob), "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self.token_text(token_id), "logprob": logprob,
                "bytes": list(self.decoded(token_id).encode("utf-8"))}
