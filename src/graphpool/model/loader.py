"""`load_model`: one entry point for the embedded GGUF default, GGUF files, HF folders and random presets."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from graphpool.model.config import ModelConfig
from graphpool.model.families import build_model
from graphpool.model.gguf_loader import (
    default_gguf_path,
    gguf_config,
    gguf_has_tokenizer,
    gguf_tokenizer_metadata,
    iter_gguf_weights,
    open_gguf,
)
from graphpool.model.hub import hub_snapshot, parse_hub_id
from graphpool.model.int4 import int4_matmul_available
from graphpool.model.llama import AttnBackend, LlamaModel
from graphpool.model.presets import PRESETS, first_layers
from graphpool.model.tokenizer import Tokenizer, tokenizer_from_folder, tokenizer_from_gguf_metadata
from graphpool.model.tokenizer_cache import load_or_convert
from graphpool.model.weights import WeightLoader, init_random_weights

DEFAULT_MODEL = "smollm2-135m-instruct"
RANDOM_PREFIX = "random:"


def accepted_models() -> str:
    presets = ", ".join(f"{RANDOM_PREFIX}{p}" for p in sorted(PRESETS))
    return (
        f"'{DEFAULT_MODEL}' (the embedded default, also None), a path to a .gguf file, "
        f"a Hugging Face model folder (config.json + *.safetensors), a Hugging Face hub id (org/name[@revision]), "
        f"or a random-weight preset: {presets} "
        f"(with '?layers=N': its first N layers only, e.g. {RANDOM_PREFIX}qwen2.5-0.5b?layers=2)"
    )


def model_source(name_or_path: str | Path | None, *, revision: str | None = None,
                 download_dir: str | None = None) -> ModelConfig | tuple[str, Path]:
    """What a model name names: a random preset's ModelConfig, or ("gguf", file) / ("hf", folder); a hub id
    (`org/name[@revision]`, when no local path of that name exists) names its snapshot folder (model/hub.py).

    The one place that reads model names: `load_model` and `model_config` both go through it."""
    name = DEFAULT_MODEL if name_or_path is None else str(name_or_path)
    if name.startswith(RANDOM_PREFIX):
        preset, _, option = name[len(RANDOM_PREFIX) :].partition("?")
        if preset not in PRESETS:
            raise ValueError(f"unknown model {name!r} (no random preset {preset!r}); accepted models: {accepted_models()}")
        if not option:
            return PRESETS[preset]
        # NOTE: fewer layers, the same shapes otherwise: quick tests of a real model's layout (CPU CI)
        key, _, value = option.partition("=")
        if key != "layers" or not value.isdigit() or int(value) < 1:
            raise ValueError(f"unknown model {name!r}: a random preset takes only '?layers=N' (N >= 1)")
        return first_layers(PRESETS[preset], int(value))
    if name == DEFAULT_MODEL:
        return ("gguf", default_gguf_path())
    path = Path(name).expanduser()
    local = _local_source(path)
    if local is not None:
        return local
    ref = parse_hub_id(name) if not path.exists() else None
    if ref is not None:
        return ("hf", hub_snapshot(ref, revision, download_dir))
    raise ValueError(f"unknown model {name!r}; accepted models: {accepted_models()}")


def _local_source(path: Path) -> tuple[str, Path] | None:
    if path.is_file() and path.suffix == ".gguf":
        return ("gguf", path)
    if path.is_dir() and (path / "config.json").is_file():
        return ("hf", path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ("gguf", ggufs[0])
    return None


def names_gguf(name_or_path: str | Path | None) -> bool:
    """Whether a model name names a GGUF file (the embedded default, a .gguf path, a folder of one), told
    without reading it or asking the hub."""
    if name_or_path is None or str(name_or_path) == DEFAULT_MODEL:
        return True
    local = _local_source(Path(str(name_or_path)).expanduser())
    return local is not None and local[0] == "gguf"


def model_config(name_or_path: str | Path | None = None, *, revision: str | None = None,
                 download_dir: str | None = None) -> ModelConfig:
    """The architecture of a model `load_model` accepts, read without loading its weights."""
    source = model_source(name_or_path, revision=revision, download_dir=download_dir)
    if isinstance(source, ModelConfig):
        return source
    kind, path = source
    if kind == "gguf":
        return gguf_config(open_gguf(path))
    return hf_folder_config(path)


def generation_config_path(name_or_path: str | Path | None = None, *, revision: str | None = None,
                           download_dir: str | None = None) -> Path | None:
    """The generation_config.json of a Hugging Face folder or hub snapshot `load_model` accepts; None for the
    others (GGUF files, the embedded default, random presets) and for a folder without one."""
    source = model_source(name_or_path, revision=revision, download_dir=download_dir)
    if isinstance(source, ModelConfig) or source[0] != "hf":
        return None
    path = source[1] / "generation_config.json"
    return path if path.is_file() else None


@torch.no_grad()
def load_model(
    name_or_path: str | Path | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    attn_backend: AttnBackend = "torch",
    *,
    seed: int = 0,
    max_positions: int | None = None,
    disabled_kernels: tuple[str, ...] = (),
    revision: str | None = None,
    download_dir: str | None = None,
    tokenizer_cache: Path | None = None,
    int4: bool = False,
) -> tuple[LlamaModel, ModelConfig, Tokenizer | None]:
    """Build and fill the model. Returns (model, config, tokenizer or None for random presets).

    `max_positions` caps the rotary cache (defaults to the model's max_position_embeddings);
    `disabled_kernels`: kernel switches off in the model's operations (`kernels/switches.py`);
    `revision`, `download_dir`: for a hub id (model/hub.py); `tokenizer_cache`: the folder a converted tokenizer
    is kept in (model/tokenizer_cache.py; None: converted on every load); `int4`: a GGUF's Q4_0 / Q4_1 / Q4_K linear
    weights stay 4-bit (model/int4.py: the CPU only, with bfloat16 `dtype`; other models load as without it).
    """
    kwargs = {"device": torch.device(device), "dtype": dtype, "attn_backend": attn_backend,
              "max_positions": max_positions, "disabled_kernels": disabled_kernels}
    source = model_source(name_or_path, revision=revision, download_dir=download_dir)
    if isinstance(source, ModelConfig):
        model = build_model(source, **kwargs)
        init_random_weights(model, seed=seed)
        return model.eval(), source, None
    kind, path = source
    if int4 and (torch.device(device).type != "cpu" or dtype != torch.bfloat16 or not int4_matmul_available()):
        raise ValueError(f"4-bit weights need the CPU, bfloat16 and torch's CPU int4 matmul (torch >= 2.5), got "
                         f"{device}, {dtype} and torch {torch.__version__}")
    if kind == "gguf":
        return _load_gguf(path, tokenizer_cache, int4, **kwargs)
    return _load_hf_folder(path, tokenizer_cache, **kwargs)


def _load_gguf(path: Path, tokenizer_cache: Path | None, int4: bool,
               **kwargs: object) -> tuple[LlamaModel, ModelConfig, Tokenizer | None]:
    """One read of the file's header shared by the config, the weights and the tokenizer; the tokenizer is
    built on a second thread while the weights are dequantized (numpy and torch release the GIL there)."""
    reader = open_gguf(path)
    config = gguf_config(reader)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gguf-tokenizer") as pool:
        tokenizer = (pool.submit(_gguf_tokenizer, reader, path, config, tokenizer_cache)
                     if gguf_has_tokenizer(reader) else None)
        model = build_model(config, **kwargs)
        loader = WeightLoader(model)
        for name, tensor in iter_gguf_weights(reader, config, model.device, int4):
            loader.load(name, tensor)
        loader.finish()
        release_freed_heap()
        return model.eval(), config, tokenizer.result() if tokenizer is not None else None


def release_freed_heap() -> None:
    """Hands the heap that loading freed back to the system: glibc keeps the freed pages of the many few-MB
    dequantization buffers in its heap (docs/benchmarks.md, "4-bit weights on the CPU")."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # NOTE: no C library to ask (not Linux): nothing to hand back this way
        return
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def _gguf_tokenizer(reader: Any, path: Path, config: ModelConfig, cache: Path | None) -> Tokenizer | None:
    return load_or_convert(
        cache, path, config.eos_token_ids,
        lambda: tokenizer_from_gguf_metadata(gguf_tokenizer_metadata(reader), path, config.eos_token_ids))


def hf_folder_config(folder: Path) -> ModelConfig:
    """config.json, with generation_config.json's end-of-text ids added: instruct models list their turn-end
    token (e.g. Llama 3's <|eot_id|>) there, and generation must stop on it too."""
    config = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    gen_path = folder / "generation_config.json"
    if not gen_path.is_file():
        return config
    eos = json.loads(gen_path.read_text()).get("eos_token_id")
    extra = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    merged = tuple(dict.fromkeys([*config.eos_token_ids, *extra]))
    return dataclasses.replace(config, eos_token_ids=merged) if merged != config.eos_token_ids else config


def _load_hf_folder(folder: Path, tokenizer_cache: Path | None,
                    **kwargs: object) -> tuple[LlamaModel, ModelConfig, Tokenizer | None]:
    from safetensors import safe_open

    config = hf_folder_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has a config.json but no *.safetensors weights")
    model = build_model(config, **kwargs)
    loader = WeightLoader(model)
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                loader.load(key, f.get_tensor(key))
    loader.finish()
    tokenizer = load_or_convert(tokenizer_cache, folder, config.eos_token_ids,
                                lambda: tokenizer_from_folder(folder, config.eos_token_ids))
    return model.eval(), config, tokenizer
