"""graphpool: an LLM inference engine whose decode step runs through a bounded, memory-honest CUDA graph pool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from graphpool.engine.llm import LLM
    from graphpool.engine.sampling_params import SamplingParams
    from graphpool.pool import GraphPool, InputSpec, PoolConfig

__all__ = ["LLM", "GraphPool", "InputSpec", "PoolConfig", "SamplingParams"]

_LAZY = {
    "LLM": "graphpool.engine.llm",
    "SamplingParams": "graphpool.engine.sampling_params",
    "GraphPool": "graphpool.pool",
    "InputSpec": "graphpool.pool",
    "PoolConfig": "graphpool.pool",
}


def __getattr__(name: str) -> Any:
    # NOTE: lazy so that `import graphpool.pool` never drags in the engine, model or server.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphpool' has no attribute {name!r}")
