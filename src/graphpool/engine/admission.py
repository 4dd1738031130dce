"""What a request must satisfy before the engine takes it: its prompt as token ids, and room for it."""

from __future__ import annotations

from typing import Any

from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.sampling_params import InvalidParam, SamplingParams, check_text


def encode_prompt(prompt: str | list[int], tokenizer: Any, vocab_size: int, model_name: str) -> list[int]:
    """Text through the tokenizer, or token ids checked against the vocabulary; InvalidParam("prompt") if empty
    or unusable."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise InvalidParam("prompt", f"model {model_name!r} has no tokenizer: give prompts as token ids")
        check_text(prompt, "prompt")
        token_ids = tokenizer.encode(prompt)
    else:
        token_ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in token_ids):
            raise InvalidParam("prompt", f"prompt token ids must be ints in [0, {vocab_size})")
    if not token_ids:
        raise InvalidParam("prompt", "the prompt is empty")
    return token_ids


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int, max_tokens: int) -> list[int]:
    """The prompt's last `keep` tokens (vLLM's truncate_prompt_tokens; -1: as many as leave room for `max_tokens`
    within `max_model_len`, at least one); all of them for None."""
    if keep is None:
        return token_ids
    if keep == -1:
        keep = max(max_model_len - max_tokens, 1)
    return token_ids[-keep:]


def check_request(prompt_len: int, params: SamplingParams, max_model_len: int, vocab_size: int,
                  block_manager: BlockManager, block_size: int) -> None:
    """A prompt that leaves room for output, stop ids inside the vocabulary, and a request that the whole KV
    cache could hold on its own."""
    if prompt_len >= max_model_len:
        raise InvalidParam(
            "prompt", f"the prompt has {prompt_len} tokens; max_model_len is {max_model_len}, which leaves no "
            "room for output (a prompt must be shorter than max_model_len)"
        )
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias),
                      ("allowed_token_ids", params.allowed_token_ids)):
        outside = [t for t in ids or () if t >= vocab_size]
        if outside:
            raise InvalidParam(name, f"{name} holds token ids outside the vocabulary [0, {vocab_size}): {outside[:8]}")
    total = min(prompt_len + params.max_tokens, max_model_len)
    if block_manager.blocks_for(total) > block_manager.num_usable_blocks:
        raise ValueError(
            f"the request needs up to {total} tokens of KV cache, more than the whole cache holds "
            f"({block_manager.num_usable_blocks * block_size} tokens)"
        )
