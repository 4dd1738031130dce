from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from graphpool.engine.cpu_threads import usable_cores

GPU_DIR = Path(__file__).parent / "gpu"
# NOTE: the largest max_model_len of any in-process user of `default_model` (EngineConfig's default).
DEFAULT_MODEL_POSITIONS = 2048
# NOTE: the default model's first four and last two of 30 layers: its first N alone repeat a few tokens
SHORT_MODEL_LAYERS = (0, 1, 2, 3, 28, 29)


def pytest_configure(config: pytest.Config) -> None:
    # NOTE: xdist's workers share the cores; torch's default, a thread a core in each of them, oversubscribes
    # them, and every op's barrier then waits for a descheduled thread (docs/benchmarks.md, "CPU threads")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        torch.set_num_threads(max(1, usable_cores() // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        # NOTE: everything under tests/gpu is a GPU test whether or not it carries the marker itself.
        if GPU_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Engines built from a config keep converted tokenizers under $XDG_CACHE_HOME: a folder of the run's own,
    not the user's (servers started by a test inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def default_model() -> tuple[Any, Any, Any]:
    """The embedded default model, loaded once per session: `load_model(None, "cpu", torch.float32, "torch")`.

    NOTE: shared and read-only: build engines over it (`LLMEngine(config, loaded=default_model)`, each with
    its own KV cache), never change the model itself."""
    from graphpool.model.loader import load_model

    return load_model(None, "cpu", torch.float32, "torch", max_positions=DEFAULT_MODEL_POSITIONS)


@pytest.fixture(scope="session")
def short_model(default_model: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The embedded model with only the layers in SHORT_MODEL_LAYERS (a copy: `default_model` stays whole), its
    tokenizer, embeddings, final norm and LM head: varied tokens (not sentences) at about twice the speed, for
    the tests that compare two engine paths token for token rather than check the model's answers. Its greedy
    steps' top-two logit margins, which decide whether two paths' last-bit differences can flip a token, are no
    thinner than the whole model's."""
    model, config, tokenizer = default_model
    short = copy.deepcopy(model)
    short.layers = torch.nn.ModuleList(short.layers[i] for i in SHORT_MODEL_LAYERS)
    short.config = dataclasses.replace(config, num_layers=len(SHORT_MODEL_LAYERS))
    return short, short.config, tokenizer


@pytest.fixture(scope="session")
def hf_default_model(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> torch.nn.Module:
    """transformers' own model from the same GGUF (float32, eval mode): the parity tests' reference.

    transformers reads a GGUF in ~15 s, so under xdist the first worker to need it saves it (float32
    tensors: exact) to the run's shared temporary folder, and the others load that."""
    from filelock import FileLock
    from transformers import AutoConfig, AutoModelForCausalLM

    from graphpool.model.gguf_loader import default_gguf_path

    path = default_gguf_path()
    if worker_id == "master":  # no xdist: nothing to share
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    shared = tmp_path_factory.getbasetemp().parent / "hf-default-model"
    with FileLock(f"{shared}.lock"):
        if (shared / "config.json").exists():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(shared)), dtype=torch.float32)
            model.load_state_dict(torch.load(shared / "weights.pt", mmap=True, weights_only=True))
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            shared.mkdir()
            torch.save(model.state_dict(), shared / "weights.pt")
            # NOTE: the config last, as the mark of a whole save (the model refuses save_pretrained: GGUF-quantized)
            model.config.save_pretrained(str(shared))
    return model.eval()
