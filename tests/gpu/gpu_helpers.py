"""Helpers of the GPU tests: a dependency is required, never skipped for, where CUDA is present."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest

SETUP_HINT = "./scripts/setup.sh installs it (GRAPHPOOL_KEEP_TORCH=1 keeps a machine's own CUDA torch)"


def require(module: str) -> ModuleType:
    """Imports ``module`` or fails the test (never skips) with what is missing and how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"this GPU test needs {module!r} ({e}); {SETUP_HINT}", pytrace=False)


def report(name: str, value: Any) -> None:
    """Prints a measured figure next to the test's assertions (shown with ``pytest -s``)."""
    print(f"[report] {name}: {value}")


def greedy_tokens(folder: str, prompts: list[list[int]], new_tokens: int, max_model_len: int,
                  **settings: Any) -> tuple[list[list[int]], Any]:
    """A model folder's float32 greedy continuations on CUDA (`new_tokens` each, past any end-of-text) and the
    pool's stats (None without graphs), the LLM closed after."""
    from graphpool import LLM, SamplingParams

    llm = LLM(folder, device="cuda", dtype="float32", max_model_len=max_model_len, num_kv_blocks=128, **settings)
    try:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [o.token_ids for o in outs], llm.graph_stats()
    finally:
        llm.close()
