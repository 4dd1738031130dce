"""What the engine hands back: per-request outputs, step info, engine stats; incremental detokenization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from graphpool.engine.logprobs import TokenLogprob
from graphpool.engine.sequence import Sequence

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # all generated so far (a stop token id is kept)
    new_token_ids: list[int]  # generated in this step
    text: str  # all so far ("" without a tokenizer); no stop string or stop token unless include_stop_str_in_output
    delta_text: str
    finished: bool
    finish_reason: FinishReason | None
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when params.logprobs is set
    new_logprobs: list[TokenLogprob] | None = None  # ... of new_token_ids
    # one per prompt token after the first (which has none), when params.prompt_logprobs is set
    prompt_logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (not prefilled), as vLLM's field
    # vLLM's: the stop string or stop_token_ids id that ended it (None: EOS, length, abort, or not finished)
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class StepInfo:
    kind: Literal["prefill", "decode", "mixed"]
    batch_size: int  # sequences in the step (a mixed step: its decode rows and its prompt chunks)
    num_tokens: int  # tokens the model processed
    seconds: float  # wall time of the whole step (sampling and bookkeeping included)
    graph: bool  # decode replayed a captured graph
    forward_seconds: float | None = None  # device time of the forward (only with profile_steps=True)
    start: float = 0.0  # time.monotonic() when the step began
    captures: int = 0  # graphs captured in the step's forward
    chained: bool = False  # launched on the device tokens of the step before, ahead of their reaching the host


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    num_free_kv_blocks: int
    num_kv_blocks: int  # usable blocks (the reserved dummy block not counted)
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    prefix_cache_queries_tokens_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_tokens_total: int = 0  # ... found there (not prefilled again)
    prefix_cache_blocks: int = 0  # KV blocks holding a cached prefix (referenced or not)
    async_chained_steps_total: int = 0  # steps launched before the step before had reached the host
    graph_warmup_pending: int = 0  # deferred warm-up graphs not captured yet (LLMEngine.idle_work)


def detokenize(seq: Sequence, tokenizer: Any, final: bool) -> None:
    """Extend `seq.text` with the newly decodable output text.

    Decodes only a short window (tokens since the last emitted boundary), and holds back text that ends in an
    incomplete UTF-8 sequence (U+FFFD) until more tokens complete it, or until the request finishes.
    """
    if tokenizer is None:
        return
    out = seq.output_token_ids
    params = seq.params
    if seq.finish_reason == "stop" and out and out[-1] in seq.stop_ids and not params.include_stop_str_in_output:
        out = out[:-1]
    skip = params.skip_special_tokens
    prefix = tokenizer.decode(out[seq.prefix_offset : seq.read_offset], skip_special_tokens=skip)
    full = tokenizer.decode(out[seq.prefix_offset :], skip_special_tokens=skip)
    if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
        seq.text += full[len(prefix) :]
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(out)


def find_stop_string(seq: Sequence, previous_len: int) -> tuple[int, str | None]:
    """Where `seq.text` is cut for the first stop string that ends in the newly added text (before it, or
    after it with `include_stop_str_in_output`), and that string; (-1, None) for none."""
    stops = seq.params.stop
    if not stops:
        return -1, None
    start = max(0, previous_len - seq.params.max_stop_len + 1)
    hits = [(i, len(s), s) for s, i in ((s, seq.text.find(s, start)) for s in stops) if i >= 0]
    if not hits:
        return -1, None
    index, length, stop = min(hits)
    return (index + length if seq.params.include_stop_str_in_output else index), stop


def length_or_stop(seq: Sequence, token: int, max_model_len: int) -> str | None:
    """The finish reason that the newly appended `token` gives, before stop strings: "stop", "length" or None."""
    # NOTE: before min_tokens nothing stops it but the length (the sampler kept stop ids from being drawn)
    if seq.num_output_tokens >= seq.params.min_tokens and token in seq.stop_ids:
        return "stop"
    if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def make_output(seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
    """The request's output now; delta_text holds back what could still become part of a stop string."""
    visible = len(seq.text)
    if not seq.finished and seq.params.stop:
        visible = max(seq.emitted_len, visible - seq.params.max_stop_len + 1)
    delta = seq.text[seq.emitted_len : visible]
    seq.emitted_len = visible
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_token_ids,
        token_ids=seq.output_token_ids,
        new_token_ids=new_token_ids,
        text=seq.text[:visible],
        delta_text=delta,
        finished=seq.finished,
        finish_reason=seq.finish_reason,  # type: ignore[arg-type]
        logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        new_logprobs=seq.logprobs[-len(new_token_ids):] if seq.params.logprobs is not None else None,
        # NOTE: the sequence's own list, complete before its first output and not changed after it
        prompt_logprobs=seq.prompt_logprobs if seq.params.prompt_logprobs is not None else None,
        num_cached_tokens=seq.num_cached_tokens or 0,
        stop_reason=seq.stop_reason,
    )
