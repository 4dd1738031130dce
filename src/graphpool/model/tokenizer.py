"""A small wrapper over the model's own Hugging Face tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class Tokenizer:
    """`encode` raw text (the tokenizer's own default special tokens, no chat template), `decode` ids,
    `apply_chat_template` with the generation prompt, and the model's stop ids in `eos_token_ids`."""

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        ids = list(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None and hf_tokenizer.eos_token_id not in ids:
            ids.append(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids: tuple[int, ...] = tuple(ids)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not self.hf.chat_template:
            raise ValueError("this model's tokenizer has no chat template; use raw text prompts")
        text = self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        # NOTE: the rendered template already holds its special tokens; add none of our own.
        return list(self.hf(text, add_special_tokens=False)["input_ids"])


def tokenizer_from_gguf(path: Path, chat_template: str | None, eos_token_ids: Sequence[int]) -> Tokenizer:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if chat_template:
        hf.chat_template = chat_template
    return Tokenizer(hf, eos_token_ids)


def tokenizer_from_folder(folder: Path, eos_token_ids: Sequence[int]) -> Tokenizer | None:
    """The folder's tokenizer, or None when the folder holds no tokenizer files."""
    if not any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(str(folder)), eos_token_ids)
