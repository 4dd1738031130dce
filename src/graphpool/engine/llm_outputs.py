"""What `LLM.generate` / `LLM.chat` return: one result per prompt, readable with graphpool's names
(`out.text`, `out.token_ids`) and with vLLM's (`out.outputs[0].text`, `out.outputs[0].token_ids`)."""

from __future__ import annotations

from dataclasses import dataclass

from graphpool.engine.logprobs import TokenLogprob


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

    @property
    def outputs(self) -> list[SequenceOutput]:
        total = sum(lp.logprob for lp in self.logprobs) if self.logprobs is not None else None
        return [SequenceOutput(0, self.text, self.token_ids, self.finish_reason, None, total, self.logprobs)]

    @property
    def finished(self) -> bool:
        return True  # NOTE: LLM.generate returns only once every request has finished


RequestOutput = CompletionOutput  # vLLM's name, for ported code that annotates with it
