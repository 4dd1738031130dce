"""The tokenizer cache: a GGUF's tokenizer converted once by transformers, then built by `tokenizers` and jinja2
alone (no transformers import on a restart) and the same as transformers' on text, ids and chat templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphpool.model import tokenizer_cache
from graphpool.model.gguf_loader import default_gguf_path, gguf_tokenizer_metadata, open_gguf
from graphpool.model.tokenizer import Tokenizer, tokenizer_from_gguf_metadata
from graphpool.model.tokenizer_backend import BackendTokenizer

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n\treturn n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "  leading and trailing spaces  , isn't it ?",
    "Ünïcödé, 中文, русский, العربية, emoji 🤖🚀 and a ZWJ 👩‍💻",
    "<|im_start|>user\nhello<|im_end|>\n<|endoftext|> special tokens inline",
    "",
    "\n\n\r\n\t",
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
# templates exercising what transformers' renderer adds to plain jinja2
TEMPLATES = {
    "tools_and_tojson": "{% if tools %}{{ tools | tojson(indent=2) }}\n{% endif %}{% for m in messages %}"
                        "<{{ m.role }}>{{ m.content | tojson }}</{{ m.role }}>\n{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}",
    "specials_and_loop_controls": "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
                                  "{% endif %}{{ m.content }}{{ eos_token }}{% endfor %}",
    "generation_block": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
    "reasoning_aliases": "{% for m in messages %}{{ m.role }}:{{ m.thinking }}|{{ m.reasoning_content }}|"
                         "{{ m.content }}\n{% endfor %}",
    "trim_and_lstrip": "{% for m in messages %}\n    {% if m.role == 'user' %}\n[U] {{ m.content }}\n    {% endif %}\n"
                       "{% endfor %}",
}
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! 🤖", "reasoning_content": "greet back"},
     {"role": "user", "content": "Ünïcödé \"quoted\" <b>?"}],
]


@pytest.fixture(scope="module")
def converted() -> Tokenizer:
    path = default_gguf_path()
    return tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(open_gguf(path)), path, (2,))


def test_backend_tokenizer_equals_transformers_on_the_default_model(converted: Tokenizer) -> None:
    fast = BackendTokenizer.from_hf(converted.hf, converted.eos_token_ids)
    assert tokenizer_cache.first_difference(fast, converted) is None
    assert (fast.vocab_size, fast.bos_token_id, fast.eos_token_ids) == (
        converted.vocab_size, converted.bos_token_id, converted.eos_token_ids)
    assert fast.max_token_chars == converted.max_token_chars
    for text in TEXTS:
        ids = converted.encode(text)
        assert fast.encode(text) == ids and fast.encode(text, False) == converted.encode(text, False), text
        assert fast.token_strs(ids) == converted.token_strs(ids)
        for skip in (True, False):
            assert fast.decode(ids, skip) == converted.decode(ids, skip)
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "not a token"):
        assert fast.has_token(marker) == converted.has_token(marker)
    assert fast.chat_template_source() == converted.chat_template_source()
    for chat in CHATS:
        for prompt in (True, False):
            assert fast.apply_chat_template(chat, add_generation_prompt=prompt) == (
                converted.apply_chat_template(chat, add_generation_prompt=prompt))


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_chat_templates_render_as_transformers_renders_them(converted: Tokenizer, name: str) -> None:
    fast = BackendTokenizer.from_hf(converted.hf, converted.eos_token_ids)
    template = TEMPLATES[name]
    for chat in CHATS:
        for tools in (None, TOOLS):
            theirs = converted.hf.apply_chat_template(chat, chat_template=template, tokenize=False,
                                                      add_generation_prompt=True, tools=tools)
            ours = fast.render_chat(chat, template, add_generation_prompt=True, tools=tools)
            assert ours == theirs, (name, chat, tools)


def test_raise_exception_and_sandbox_refuse_as_errors(converted: Tokenizer) -> None:
    import jinja2

    fast = BackendTokenizer.from_hf(converted.hf, converted.eos_token_ids)
    with pytest.raises(jinja2.TemplateError, match="no system role"):
        fast.render_chat(CHATS[1], "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}"
                                   "{% endif %}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        fast.render_chat(CHATS[0], "{{ messages.__class__.__mro__ }}{% set _ = messages.append(1) %}")


def test_store_then_load_gives_the_same_tokenizer(converted: Tokenizer, tmp_path: Path) -> None:
    path = default_gguf_path()
    assert tokenizer_cache.load_cached(tmp_path, path, (2,)) is None
    stored = tokenizer_cache.store(tmp_path, path, converted)
    assert isinstance(stored, BackendTokenizer)
    loaded = tokenizer_cache.load_cached(tmp_path, path, (2,))
    assert isinstance(loaded, BackendTokenizer)
    assert tokenizer_cache.first_difference(loaded, converted) is None
    settings = json.loads((tokenizer_cache.entry_dir(tmp_path, path) / "settings.json").read_text())
    assert settings["chat_template"] == converted.hf.chat_template and settings["special_tokens"]["eos_token"]


def test_a_changed_file_or_a_bad_entry_converts_again(converted: Tokenizer, tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.symlink_to(default_gguf_path())
    cache = tmp_path / "cache"
    tokenizer_cache.store(cache, gguf, converted)
    entry = tokenizer_cache.entry_dir(cache, gguf)
    assert tokenizer_cache.load_cached(cache, gguf, (2,)) is not None
    (entry / "tokenizer.json").write_text("{not json")
    assert tokenizer_cache.load_cached(cache, gguf, (2,)) is None and not entry.exists()
    assert isinstance(tokenizer_cache.store(cache, gguf, converted), BackendTokenizer)
    assert tokenizer_cache.load_cached(cache, gguf, (2,)) is not None


def test_the_entry_follows_the_file_path_and_modification(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF")
    b.write_bytes(b"GGUF")
    first = tokenizer_cache.entry_dir(tmp_path, a)
    assert tokenizer_cache.entry_dir(tmp_path, a) == first
    assert tokenizer_cache.entry_dir(tmp_path, b) != first
    os.utime(a, (1, 1))
    assert tokenizer_cache.entry_dir(tmp_path, a) != first


def test_a_tokenizer_that_would_differ_is_not_cached(converted: Tokenizer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real = BackendTokenizer.decode
    monkeypatch.setattr(BackendTokenizer, "decode", lambda self, ids, skip_special_tokens=True: real(self, ids, skip_special_tokens).upper())
    assert tokenizer_cache.store(tmp_path, default_gguf_path(), converted) is converted
    assert not any((tmp_path / "tokenizers").glob("*/settings.json"))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory, converted: Tokenizer) -> Path:
    """A tiny Llama saved as a Hugging Face folder with the default model's tokenizer."""
    from model_reference import tiny_hf_model

    folder = tmp_path_factory.mktemp("hf-folder")
    tiny_hf_model("llama", True).save_pretrained(folder, safe_serialization=True)
    converted.hf.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["gguf", "folder"])
def test_a_restart_loads_the_tokenizer_without_importing_transformers(kind: str, hf_folder: Path,
                                                                        tmp_path: Path) -> None:
    model = "None" if kind == "gguf" else repr(str(hf_folder))
    code = ("import sys; from pathlib import Path; from graphpool.model.loader import load_model; "
            f"_, _, tok = load_model({model}, 'cpu', max_positions=32, tokenizer_cache=Path(sys.argv[1])); "
            "print(type(tok).__name__, 'transformers' in sys.modules, tok.encode('Hello there'))")
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                           check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.split(maxsplit=2)
            for _ in range(2)]
    assert runs[0][:2] == ["BackendTokenizer", "True"]  # converted by transformers, then kept
    assert runs[1][:2] == ["BackendTokenizer", "False"]
    assert runs[0][2] == runs[1][2]


def test_a_folder_entry_follows_its_tokenizer_files_not_its_weights(hf_folder: Path, tmp_path: Path) -> None:
    first = tokenizer_cache.entry_dir(tmp_path, hf_folder)
    weights = next(hf_folder.glob("*.safetensors"))
    os.utime(weights, (1, 1))
    assert tokenizer_cache.entry_dir(tmp_path, hf_folder) == first
    os.utime(hf_folder / "tokenizer_config.json", (1, 1))
    assert tokenizer_cache.entry_dir(tmp_path, hf_folder) != first


def test_the_cache_folder_is_configured_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from graphpool.engine.args import add_engine_args, engine_config_from_args
    from graphpool.engine.config import EngineConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert EngineConfig().tokenizer_cache == tmp_path / "graphpool"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert EngineConfig().tokenizer_cache == Path.home() / ".cache" / "graphpool"
    assert EngineConfig(cache_dir="").tokenizer_cache is None
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--cache-dir", str(tmp_path / "c")]))
    assert config.tokenizer_cache == tmp_path / "c"


def test_an_unwritable_cache_still_gives_the_tokenizer(converted: Tokenizer, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # the cache's folder cannot be made under a file
    assert isinstance(tokenizer_cache.store(blocked, default_gguf_path(), converted), BackendTokenizer)
    assert "cannot cache the tokenizer" in caplog.text
    assert tokenizer_cache.load_cached(blocked, default_gguf_path(), (2,)) is None
