"""A small wrapper over the model's own Hugging Face tokenizer and chat template."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphpool.model.chat_render import check_continuation, check_template_vars, cut_after

logger = logging.getLogger(__name__)


class Tokenizer:
    """`encode` raw text (the tokenizer's own default special tokens, no chat template), `decode` ids,
    `apply_chat_template` with the generation prompt, and the model's stop ids in `eos_token_ids`."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        self.eos_token_ids = with_eos(eos_token_ids, hf_tokenizer.eos_token_id)

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The model's own chat template: a Jinja source, a name -> source dict, or None."""
        return self.hf.chat_template  # type: ignore[no-any-return]

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters any one token's vocabulary entry has: a text of more than n times this many
        characters cannot encode to n tokens or fewer (byte-level entries spell each byte as one character)."""
        return max((len(t) for t in self.hf.get_vocab()), default=1)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def chat_template_source(self, chat_template: str | None = None, tools: bool = False) -> str | None:
        """The Jinja source `apply_chat_template` renders with (the tool-use one of a model that has several
        when `tools`); None when there is none."""
        if not (chat_template or self.chat_template):
            return None
        return self._choose_template(chat_template, tools)

    def _choose_template(self, chat_template: str | None, tools: bool) -> str:
        return str(self.hf.get_chat_template(chat_template, tools=[{}] if tools else None))

    def has_token(self, text: str) -> bool:
        """Whether `text` is one entry of the vocabulary (a marker token such as `<tool_call>`)."""
        return text in self.hf.get_vocab()

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each id's vocabulary entry (byte-level spelling, as vLLM's /tokenize returns them)."""
        return [str(t) for t in self.hf.convert_ids_to_tokens(list(ids))]

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], chat_template: str | None = None,
        add_generation_prompt: bool = True, add_special_tokens: bool = False,
        tools: list[dict[str, Any]] | None = None, *, template_vars: Mapping[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """The conversation as token ids (`render_chat`, then encoded)."""
        if not (chat_template or self.chat_template):
            raise ValueError("this model's tokenizer has no chat template; use raw text prompts")
        text = self.render_chat(messages, chat_template, add_generation_prompt, tools, template_vars=template_vars,
                                continue_final_message=continue_final_message)
        # NOTE: the rendered template already holds its special tokens; by default add none of our own.
        return self.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], chat_template: str | None = None,
                    add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None, *,
                    template_vars: Mapping[str, Any] | None = None, continue_final_message: bool = False) -> str:
        """The conversation as text through the chat template. `chat_template` (a Jinja source) replaces the
        model's own; `tools` (OpenAI function tools) go to the template as its `tools` variable; `template_vars`
        are more of its variables (`enable_thinking`, ...: each one it reads, else ChatRequestError);
        `continue_final_message` leaves the final message open for the model to continue (no generation prompt).
        """
        final = check_continuation(messages, add_generation_prompt) if continue_final_message else None
        if template_vars:
            check_template_vars(self._choose_template(chat_template, tools is not None), template_vars)
        text = self._render(messages, chat_template, add_generation_prompt, tools, template_vars or {})
        return text if final is None else cut_after(text, final)

    def _render(self, messages: Sequence[Mapping[str, Any]], chat_template: str | None, add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, template_vars: Mapping[str, Any]) -> str:
        return str(self.hf.apply_chat_template(list(messages), chat_template=chat_template, tokenize=False,
                                               add_generation_prompt=add_generation_prompt, tools=tools,
                                               **template_vars))

def with_eos(eos_token_ids: Sequence[int], eos_token_id: int | None) -> tuple[int, ...]:
    """The model's stop ids with the tokenizer's own end-of-text id added (when it has one not among them)."""
    ids = list(eos_token_ids)
    if eos_token_id is not None and eos_token_id not in ids:
        ids.append(int(eos_token_id))
    return tuple(ids)


def tokenizer_from_gguf(path: Path, chat_template: str | None, eos_token_ids: Sequence[int]) -> Tokenizer:
    """transformers' own GGUF path: it reads the file again (twice, in transformers 5)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if chat_template:
        hf.chat_template = chat_template
    return Tokenizer(hf, eos_token_ids)


_SPECIAL_TOKEN_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _renamed(meta: Mapping[str, Any], mapping: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, Any]]:
    """transformers' GGUF_TOKENIZER_MAPPING applied: per group, its ``tokenizer.*`` keys under their new names."""
    return {group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
            for group, renames in mapping.items()}


def hf_tokenizer_from_gguf_metadata(meta: Mapping[str, Any]) -> Any | None:
    """The Hugging Face tokenizer a GGUF file describes, from its already-read ``tokenizer.*`` and
    ``general.architecture`` values, through transformers' own GGUF converter; None where this
    transformers has no such converter (before 5.0).

    The grouping mirrors ``transformers.integrations.gguf.get_gguf_tokenizer``, which takes a path and reads
    the file itself; tests/model/test_model_tokenizer_gguf.py holds the result equal to ``AutoTokenizer``'s.
    """
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return _hf_tokenizer_from_ggml_mapping(meta)
    groups = _renamed(meta, GGUF_TOKENIZER_MAPPING)
    tokenizer_dict, tokenizer_config = groups["tokenizer"], groups["tokenizer_config"]
    kind = tokenizer_dict.get("tokenizer_type")
    if kind == "llama":  # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise
        tokenizer_config.setdefault("add_bos_token", True)
    elif kind == "gemma4":
        tokenizer_config["add_bos_token"] = False
    tokens = tokenizer_dict["tokens"]
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(meta["general.architecture"], tokenizer_dict)
    return TokenizersBackend(tokenizer_object=backend, **tokenizer_config, **extra)


def _hf_tokenizer_from_ggml_mapping(meta: Mapping[str, Any]) -> Any | None:
    """The same for transformers 5 releases whose converter sits in ``integrations.ggml`` (5.17, the H200's):
    their ``TokenizersBackend(gguf_file=...)`` passes the renamed ``tokenizer_config`` group as it is, and so
    does this (seen equal to that AutoTokenizer on the default model: encodings, chat template, special tokens).
    None before transformers 5."""
    try:
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    groups = _renamed(meta, GGUF_TOKENIZER_MAPPING)
    backend, extra = convert_gguf_tokenizer(meta["general.architecture"], groups["tokenizer"])
    return TokenizersBackend(tokenizer_object=backend, **groups["tokenizer_config"], **extra)


def tokenizer_from_gguf_metadata(
    meta: Mapping[str, Any], path: Path, eos_token_ids: Sequence[int]
) -> Tokenizer:
    """The GGUF's tokenizer from its already-read metadata; with a transformers that has no converter to reuse
    (before 5), transformers reads ``path`` itself."""
    hf = hf_tokenizer_from_gguf_metadata(meta)
    if hf is None:
        logger.info("transformers %s has no GGUF tokenizer converter; it reads %s again", _version(), path)
        return tokenizer_from_gguf(path, meta.get("tokenizer.chat_template"), eos_token_ids)
    return Tokenizer(hf, eos_token_ids)


def _version() -> str:
    import transformers

    return str(transformers.__version__)


def tokenizer_from_folder(folder: Path, eos_token_ids: Sequence[int]) -> Tokenizer | None:
    """The folder's tokenizer, or None when the folder holds no tokenizer files."""
    if not any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(str(folder)), eos_token_ids)
