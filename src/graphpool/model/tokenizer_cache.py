"""A model's tokenizer (a GGUF file's, or a Hugging Face folder's) kept on disk once transformers has built it: the
`tokenizers` library's own tokenizer.json, with the special tokens and chat template beside it. A restart builds
the tokenizer from those with `tokenizers` and jinja2 alone; importing transformers again costs seconds of start-up.

A converted tokenizer is kept only when it encodes, decodes and renders the probes below exactly as transformers'
does (a slow, non-`tokenizers` one is never kept); otherwise the load goes on with transformers' and nothing is
written. The entry's key holds the source's path, the size and modification time of the file (of a folder: of each
file but the weights) and the transformers and tokenizers versions, so a changed file or library converts anew.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphpool.model.tokenizer import Tokenizer
from graphpool.model.tokenizer_backend import BackendTokenizer

logger = logging.getLogger(__name__)

FORMAT = 1  # NOTE: bump when what an entry holds changes
PROBE_TEXTS = (
    "Hello, world! It's a test , isn't it ?",
    " leading space\n\ttabs  and  runs of spaces ",
    "Ünïcödé, 中文, русский, emoji 🤖 and a ZWJ 👩‍💻",
    "def f(x):\n    return x * 2  # 3.14159 -42 1e-9",
    "",
)
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
PROBE_CHATS = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! 🤖"}, {"role": "user", "content": "Ünïcödé?"}],
)

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def entry_dir(cache_dir: Path, source: Path) -> Path:
    """Where `source`'s (a GGUF file's, or a folder's) tokenizer is kept, as things stand on disk now."""
    files = [source] if not source.is_dir() else sorted(
        f for f in source.iterdir() if f.is_file() and not f.name.endswith(_WEIGHTS))
    stats = [(f.name, f.stat()) for f in files]
    versions = [_version(name) for name in ("transformers", "tokenizers")]
    key = "|".join([str(FORMAT), str(source.resolve()), *versions,
                    *(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats)])
    return cache_dir / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:32]


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def load_or_convert(cache_dir: Path | None, source: Path, eos_token_ids: tuple[int, ...],
                    convert: Callable[[], Tokenizer | None]) -> Tokenizer | None:
    """`source`'s cached tokenizer; else `convert()`'s (transformers'), kept for the next start where it can be."""
    if cache_dir is None:
        return convert()
    cached = load_cached(cache_dir, source, eos_token_ids)
    if cached is not None:
        return cached
    converted = convert()
    return store(cache_dir, source, converted) if converted is not None else None


def load_cached(cache_dir: Path, source: Path, eos_token_ids: tuple[int, ...]) -> BackendTokenizer | None:
    """The source's cached tokenizer, or None when there is none (or it cannot be read: it is converted anew)."""
    entry = entry_dir(cache_dir, source)
    if not (entry / "settings.json").is_file():
        return None
    from tokenizers import Tokenizer as RustTokenizer

    try:
        settings = json.loads((entry / "settings.json").read_text())
        backend = RustTokenizer.from_file(str(entry / "tokenizer.json"))
        return BackendTokenizer(backend, settings["special_tokens"], settings["chat_template"], eos_token_ids)
    except Exception as e:  # tokenizers raises a plain Exception on a bad file
        logger.warning("the cached tokenizer in %s cannot be read (%s); converting %s again", entry, e, source)
        shutil.rmtree(entry, ignore_errors=True)  # so that the conversion's entry can take its place
        return None


def store(cache_dir: Path, source: Path, converted: Tokenizer) -> Tokenizer:
    """`converted` (transformers') as a BackendTokenizer, written to the cache, when the two agree on the probes;
    else `converted` itself, and nothing is written."""
    if not getattr(converted.hf, "is_fast", False):
        logger.info("not caching %s's tokenizer: transformers built a slow (Python) one", source)
        return converted
    fast = BackendTokenizer.from_hf(converted.hf, converted.eos_token_ids)
    difference = first_difference(fast, converted)
    if difference is not None:
        logger.info("not caching %s's tokenizer: without transformers it would differ (%s)", source, difference)
        return converted
    entry = entry_dir(cache_dir, source)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".partial-"))
        fast.backend.save(str(staging / "tokenizer.json"))
        settings = {"format": FORMAT, "special_tokens": fast.special_tokens, "chat_template": fast.chat_template}
        (staging / "settings.json").write_text(json.dumps(settings))
        try:
            os.replace(staging, entry)
        except OSError:  # another process stored it first
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        logger.warning("cannot cache the tokenizer in %s (%s): the next start converts it again", entry.parent, e)
    return fast


def first_difference(fast: BackendTokenizer, reference: Tokenizer) -> str | None:
    """Where `fast` and transformers' `reference` first differ on the probes (None: nowhere)."""
    if fast.vocab_size != reference.vocab_size or fast.eos_token_ids != reference.eos_token_ids:
        return "vocabulary size or end-of-text ids"
    if fast.bos_token_id != reference.bos_token_id:
        return "bos token"
    for text in PROBE_TEXTS:
        for special in (True, False):
            ids = reference.encode(text, add_special_tokens=special)
            if fast.encode(text, add_special_tokens=special) != ids:
                return f"encoding {text!r}"
            for skip in (True, False):
                if fast.decode(ids, skip_special_tokens=skip) != reference.decode(ids, skip_special_tokens=skip):
                    return f"decoding {text!r}"
    if reference.chat_template_source() is None:
        return None if fast.chat_template_source() is None else "chat template"
    for chat in PROBE_CHATS:
        for prompt, tools in ((True, None), (False, None), (True, PROBE_TOOLS)):
            if _rendered(fast, chat, prompt, tools) != _rendered(reference, chat, prompt, tools):
                return "chat template rendering"
    return None


def _rendered(tokenizer: Tokenizer, chat: Any, prompt: bool, tools: Any) -> list[int] | str:
    import jinja2

    try:
        return tokenizer.apply_chat_template(chat, add_generation_prompt=prompt, tools=tools)
    except (ValueError, jinja2.TemplateError):
        return "raises"  # the two libraries word their errors differently
