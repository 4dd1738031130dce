"""Guided decoding through xgrammar: compiled grammars (cached by spec), one matcher per request, and the
per-step token mask.

xgrammar is imported on the first guided request (it is part of the `server` extra), so an engine that never
sees one does not need it. Per step the sampler fills each guided row's bitmask from its matcher and sets the
disallowed logits to -inf (on its own copy of the logits, after the decode graph's replay); the engine then
feeds the sampled token to the matcher. The mask needs the previous token accepted, so a batch holding guided
rows is never launched ahead by async scheduling (engine/async_scheduling.py).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from graphpool.engine.guided import GuidedDecoding
from graphpool.engine.sampling_params import InvalidParam

if TYPE_CHECKING:
    import xgrammar

# NOTE: compiled JSON is written with fixed separators (", " and ": "): free whitespace lets a model loop on it.
_JSON_OPTIONS: dict[str, Any] = {"any_whitespace": False}
_ANY_OBJECT = '{"type": "object"}'
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes a failed check's text.
_ERROR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class Grammars:
    """Compiles `GuidedDecoding` constraints against one tokenizer and logits width, thread-safe (the server
    compiles off its event loop, the engine thread again on admission: a cache hit). The `cache_size` most
    recently used compiled grammars are kept, by (kind, spec)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int], cache_size: int = 256) -> None:
        self.tokenizer = tokenizer  # graphpool's Tokenizer (its `.hf` is transformers'), or None
        self.vocab_size = vocab_size  # the logits' width: ids past the tokenizer's are never allowed
        self.eos_token_ids = sorted(eos_token_ids)
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._cache: OrderedDict[GuidedDecoding, xgrammar.CompiledGrammar] = OrderedDict()
        self._compiler: xgrammar.GrammarCompiler | None = None

    def compile(self, guided: GuidedDecoding) -> xgrammar.CompiledGrammar:
        """The compiled grammar (cached); InvalidParam("guided") when the spec does not compile."""
        with self._lock:
            hit = self._cache.get(guided)
            if hit is not None:
                self._cache.move_to_end(guided)
                return hit
        compiler = self._get_compiler()
        try:
            compiled = _compile(compiler, guided)
        except RuntimeError as e:
            detail = _ERROR_PREFIX.sub("", str(e).strip().splitlines()[0] if str(e).strip() else "")
            raise InvalidParam("guided", f"the {guided.kind} constraint does not compile: {detail}") from None
        except UnicodeDecodeError:  # NOTE: xgrammar's message quoted the spec cut inside a character
            raise InvalidParam("guided", f"the {guided.kind} constraint does not compile") from None
        with self._lock:
            self._cache[guided] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def guide(self, guided: GuidedDecoding, stop_ids: Iterable[int]) -> Guide:
        """A fresh matcher for one request; the grammar ends on one of `stop_ids` (or, with none, as soon as it
        is complete)."""
        import xgrammar as xgr

        stops = sorted(stop_ids)
        if stops:
            matcher = xgr.GrammarMatcher(self.compile(guided), override_stop_tokens=stops)
        else:
            matcher = xgr.GrammarMatcher(self.compile(guided), terminate_without_stop_token=True)
        return Guide(matcher, self.vocab_size)

    def _get_compiler(self) -> xgrammar.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise InvalidParam("guided", "this model has no tokenizer: guided decoding needs one")
                try:
                    import xgrammar as xgr
                except ImportError as e:
                    raise ImportError("guided decoding needs xgrammar: pip install 'graphpool[server]'") from e
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer.hf, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_token_ids or None)
                # NOTE: the bounded cache above is the one cache; xgrammar's own would grow without bound.
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler


def _compile(compiler: xgrammar.GrammarCompiler, guided: GuidedDecoding) -> xgrammar.CompiledGrammar:
    if guided.kind == "json_schema":
        return compiler.compile_json_schema(guided.spec, strict_mode=True, **_JSON_OPTIONS)
    if guided.kind == "json_object":
        return compiler.compile_json_schema(_ANY_OBJECT, strict_mode=False, **_JSON_OPTIONS)
    if guided.kind == "regex":
        return compiler.compile_regex(guided.spec)
    if guided.kind == "structural_tag":
        return compiler.compile_structural_tag(guided.spec)
    if guided.kind == "choice":
        # NOTE: JSON string escapes are EBNF string escapes, so each choice is one literal.
        return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in guided.choices))
    return compiler.compile_grammar(guided.spec)


class Guide:
    """One request's grammar state: `fill` its row of a step's bitmask, `accept` the token sampled there."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance past `token`; True once the grammar has ended (its stop token accepted, or complete with no
        stop tokens)."""
        if not self.matcher.accept_token(token):
            # NOTE: the step's mask allowed only what the matcher accepts: a rejection is a bug, not bad input
            raise RuntimeError(f"guided decoding: the grammar rejected token {token}, which its mask allowed")
        return bool(self.matcher.is_terminated())


def apply_guides(logits: torch.Tensor, guides: list[Guide], rows: list[int]) -> None:
    """Sets, in place, each guided row's logits that its grammar disallows next to -inf (`logits` must be the
    sampler's own copy, not a graph's output buffer), logits past the grammar's vocabulary included."""
    import xgrammar as xgr

    vocab = guides[0].vocab_size
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], vocab)
    for guide, row in zip(guides, rows, strict=True):
        guide.fill(bitmask, row)
    width = min(vocab, logits.shape[1])
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=width,
                                    indices=rows)
    if logits.shape[1] > vocab:
        index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
        logits[index, vocab:] = float("-inf")
