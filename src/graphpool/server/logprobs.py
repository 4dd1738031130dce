"""The engine's per-token logprobs in OpenAI's response shapes: the completions API's `tokens` /
`token_logprobs` / `top_logprobs` / `text_offset` lists and the chat API's `content` entries.

Every generated token is listed, a stop token included (usage counts it too), each as its own text decoded
alone with special tokens kept; a tokenizer-less model names tokens `token_id:<id>` (vLLM's spelling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphpool.engine.logprobs import TokenLogprob


class LogprobFormatter:
    """Turns `TokenLogprob`s into the response fields of either endpoint."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            if self.tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text

    def completion(self, logprobs: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        """The completions API's `logprobs` object; `offset`: the text offset of the first token (streaming
        continues where the previous chunk ended). Each `top_logprobs` entry holds the top tokens and the
        sampled one (OpenAI: up to `logprobs` + 1 entries)."""
        tokens, values, tops, offsets = [], [], [], []
        for lp in logprobs:
            text = self.token_text(lp.token_id)
            tokens.append(text)
            values.append(lp.logprob)
            top = {self.token_text(t): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            tops.append(top)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def chat(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The chat API's `logprobs` object: one `content` entry per token, with its `top_logprobs`."""
        return {"content": [
            {**self._entry(lp.token_id, lp.logprob), "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
