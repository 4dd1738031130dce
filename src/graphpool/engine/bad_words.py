"""vLLM's `bad_words`: words a request's output must not contain. Each word is tokenized as written and after a
space (how it mostly follows other text); a step bans the token that would complete one of those token sequences
after the output so far (a one-token word outright), -inf on the sampler's float32 copy of the logits. A request
with a word of several tokens steps without async scheduling's lookahead (its ban needs the token in flight)."""

from __future__ import annotations

from typing import Any

from graphpool.engine.sequence import Sequence


def bad_word_ids(words: list[str], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token sequences of `words`, each as written and after a space."""
    found = {tuple(tokenizer.encode(text, add_special_tokens=False)) for w in words for text in (w, " " + w.lstrip())}
    return tuple(sorted(ids for ids in found if ids))


def needs_history(seq: Sequence) -> bool:
    """Whether a step's ban for `seq` depends on its last tokens (a word of several tokens)."""
    return any(len(ids) > 1 for ids in seq.bad_words)


def banned_tokens(seq: Sequence) -> list[int]:
    """The tokens that would complete one of `seq`'s bad words after its output so far."""
    out = seq.output_token_ids
    banned = []
    for ids in seq.bad_words:
        prefix = ids[:-1]
        if not prefix or (len(out) >= len(prefix) and tuple(out[len(out) - len(prefix):]) == prefix):
            banned.append(ids[-1])
    return banned
