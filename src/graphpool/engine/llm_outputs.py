"""What `LLM.generate` / `LLM.chat` return: one result per prompt, readable with graphpool's names
(`out.text`, `out.token_ids`) and with vLLM's (`out.outputs[0].text`, `out.outputs[0].token_ids`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from graphpool.engine.logprobs import TokenLogprob


@dataclass(frozen=True)
class Logprob:
    """A token's logprob at a prompt position, as vLLM shapes it: its 1-based rank in the vocabulary by
    logprob and its text (decoded alone, special tokens kept; None without a tokenizer)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, Logprob] | None]


def token_texts(tokenizer: Any) -> Callable[[int], str | None]:
    """A token id's text decoded alone, special tokens kept (cached); None without a tokenizer."""
    if tokenizer is None:
        return lambda token_id: None
    return functools.lru_cache(maxsize=None)(lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False))


def prompt_logprob_dicts(prompt_logprobs: Sequence[TokenLogprob], k: int,
                         text: Callable[[int], str | None]) -> PromptLogprobs:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then per position a dict token id ->
    `Logprob` holding the prompt token and the `k` most likely tokens (k or k + 1 entries); `text` names a
    token (`token_texts`)."""
    out: PromptLogprobs = [None]
    for lp in prompt_logprobs:
        entry = {t: Logprob(v, rank, text(t)) for rank, (t, v) in enumerate(lp.top[:k], start=1)}
        entry.setdefault(lp.token_id, Logprob(lp.logprob, lp.rank, text(lp.token_id)))
        out.append(entry)
    return out


@dataclass(frozen=True)
class SequenceOutput:
    """One generated sequence, shaped as vLLM's `CompletionOutput` (this engine makes one per prompt). With
    `SamplingParams.logprobs`, `logprobs` holds graphpool's `TokenLogprob` per token (not vLLM's dicts) and
    `cumulative_logprob` their sum; else both are None."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class CompletionOutput:
    """A prompt's result (vLLM calls this a `RequestOutput`)."""

    prompt: str | list[int]
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    request_id: str = ""
    logprobs: list[TokenLogprob] | None = None  # per token, with SamplingParams.logprobs
    prompt_logprobs: PromptLogprobs | None = None  # with SamplingParams.prompt_logprobs (`prompt_logprob_dicts`)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held (not prefilled again)
    stop_reason: int | str | None = None  # the stop string or stop_token_ids id that ended it

    @property
    def outputs(self) -> list[SequenceOutput]:
        total = sum(lp.logprob for lp in self.logprobs) if self.logprobs is not None else None
        return [SequenceOutput(0, self.text, self.token_ids, self.finish_reason, self.stop_reason, total,
                               self.logprobs)]

    @property
    def finished(self) -> bool:
        return True  # NOTE: LLM.generate returns only once every request has finished


RequestOutput = CompletionOutput  # vLLM's name, for ported code that annotates with it
