"""The default model's tokenizer built from the GGUF metadata the loader already read equals the one
transformers builds from the file itself (AutoTokenizer, gguf_file=...), and loading reads the file once."""

from __future__ import annotations

import os
from typing import Any

import pytest

from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
from graphpool.model.tokenizer import Tokenizer, hf_tokenizer_from_gguf_metadata, tokenizer_from_gguf

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n\treturn n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  leading and trailing spaces  ",
    "Ünïcödé, 中文, русский, العربية, emoji 🤖🚀 and a ZWJ 👩‍💻",
    "<|im_start|>user\nhello<|im_end|>\n<|endoftext|> special tokens inline",
    "numbers 1234567890 3.14159 -42 1e-9",
    "",
    "\n\n\r\n\t",
    "a" * 300,
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! 🤖"},
        {"role": "user", "content": "Ünïcödé?"},
    ],
]


@pytest.fixture(scope="module")
def tokenizers() -> tuple[Any, Any]:
    path = default_gguf_path()
    new = hf_tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)))
    if new is None:
        pytest.skip("this transformers has no GGUF tokenizer converter (< 5.0): the loader uses the old path")
    old = tokenizer_from_gguf(path, None, ()).hf
    return new, old


def test_backend_and_special_tokens_equal_transformers(tokenizers: tuple[Any, Any]) -> None:
    new, old = tokenizers
    assert new.backend_tokenizer.to_str() == old.backend_tokenizer.to_str()
    assert len(new) == len(old) == 49152
    for attr in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "all_special_ids"):
        assert getattr(new, attr) == getattr(old, attr), attr
    assert new.chat_template == old.chat_template and new.chat_template


def test_encode_decode_and_chat_template_equal_transformers(tokenizers: tuple[Any, Any]) -> None:
    new, old = tokenizers
    for text in TEXTS:
        ids = old(text)["input_ids"]
        assert new(text)["input_ids"] == ids, text
        assert (
            new(text, add_special_tokens=False)["input_ids"]
            == old(text, add_special_tokens=False)["input_ids"]
        )
        for skip in (True, False):
            assert new.decode(ids, skip_special_tokens=skip) == old.decode(ids, skip_special_tokens=skip)
    ours, theirs = Tokenizer(new, (2,)), Tokenizer(old, (2,))
    for chat in CHATS:
        assert new.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
            old.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        )
        assert ours.apply_chat_template(chat) == theirs.apply_chat_template(chat)
    assert ours.eos_token_ids == theirs.eos_token_ids


def test_load_model_opens_the_gguf_file_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """gguf's reader and transformers' both open the file by path (np.memmap): count those opens."""
    import builtins

    import transformers

    from graphpool.model.loader import load_model

    if not _has_converter():
        pytest.skip("this transformers has no GGUF tokenizer converter (< 5.0): it reads the file itself")
    path = default_gguf_path()
    opens: list[str] = []
    real_open = builtins.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, bytes, os.PathLike)) and os.fsdecode(file) == str(path):
            opens.append(os.fsdecode(file))
        return real_open(file, *args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("AutoTokenizer.from_pretrained reads the GGUF file again")

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    _, _, tokenizer = load_model(None, "cpu", max_positions=64)
    assert tokenizer is not None and tokenizer.encode("Hello") == tokenizer.hf("Hello")["input_ids"]
    assert len(opens) == 1, opens


def _has_converter() -> bool:
    try:
        import transformers.integrations.gguf.gguf_tokenizer_mapping  # noqa: F401
    except ImportError:
        return False
    return True
