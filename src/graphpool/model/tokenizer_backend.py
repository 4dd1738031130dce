"""A Tokenizer over the `tokenizers` library alone: what a restart loads from the tokenizer cache without importing
transformers (seconds of start-up). transformers' own tokenizer over the same backend is built on first use of
`hf` (guided decoding's xgrammar takes one)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from graphpool.model.chat_render import SPECIAL_TOKEN_NAMES, render_chat
from graphpool.model.tokenizer import Tokenizer, with_eos


class BackendTokenizer(Tokenizer):
    """`backend`: a `tokenizers.Tokenizer` (its post-processor adds the special tokens); `special_tokens`: name ->
    text (bos_token, eos_token, ...); `chat_template`: a Jinja source, a name -> source dict, or None."""

    def __init__(self, backend: Any, special_tokens: Mapping[str, str],
                 chat_template: str | dict[str, str] | None, eos_token_ids: Sequence[int] = ()) -> None:
        self.backend = backend
        self.special_tokens = {k: v for k, v in special_tokens.items() if k in SPECIAL_TOKEN_NAMES and v is not None}
        self._chat_template = chat_template
        self.eos_token_ids = with_eos(eos_token_ids, self._token_id("eos_token"))

    @classmethod
    def from_hf(cls, hf: Any, eos_token_ids: Sequence[int] = ()) -> BackendTokenizer:
        """The same tokenizer as transformers' fast tokenizer `hf`, over a copy of its backend."""
        from tokenizers import Tokenizer as RustTokenizer

        return cls(RustTokenizer.from_str(hf.backend_tokenizer.to_str()), dict(hf.special_tokens_map),
                   hf.chat_template, eos_token_ids)

    def _token_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self.backend.token_to_id(text)

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        return self._chat_template

    @functools.cached_property
    def hf(self) -> Any:  # type: ignore[override]
        """transformers' fast tokenizer over a copy of this backend (imports transformers)."""
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(self.backend.to_str()),
                                     **self.special_tokens)
        hf.chat_template = self.chat_template
        return hf

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def max_token_chars(self) -> int:
        return max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1)

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def _choose_template(self, chat_template: str | None, tools: bool) -> str:
        """transformers' choice: the given source (or the name of one of the model's), else the model's own (its
        `tool_use` one when there are tools, else its `default`)."""
        own = self.chat_template
        if isinstance(own, dict):
            if chat_template is not None:
                return own.get(chat_template, chat_template)
            if tools and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise ValueError(f"this model has several chat templates and no default: {sorted(own)}")
        source = chat_template if chat_template is not None else own
        if source is None:
            raise ValueError("this model's tokenizer has no chat template; use raw text prompts")
        return source

    def has_token(self, text: str) -> bool:
        return self.backend.token_to_id(text) is not None

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [str(self.backend.id_to_token(int(i))) for i in ids]

    def _render(self, messages: Sequence[Mapping[str, Any]], chat_template: str | None, add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, template_vars: Mapping[str, Any]) -> str:
        return render_chat(self._choose_template(chat_template, tools is not None), messages, self.special_tokens,
                           add_generation_prompt=add_generation_prompt, tools=tools, template_vars=template_vars)
