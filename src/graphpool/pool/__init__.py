"""graphpool.pool: a bounded, memory-honest pool of CUDA graphs for any decode step.

Imports nothing from graphpool.engine, graphpool.model or graphpool.server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphpool.pool.buckets import BucketLadder
    from graphpool.pool.capture import CAPTURE_ERRORS, CapturedGraph, Capturer, CudaGraphCapturer
    from graphpool.pool.config import DEFAULT_MISS_POLICY, PoolConfig
    from graphpool.pool.failures import CaptureError, CaptureFailureKind
    from graphpool.pool.inputs import InputSpec
    from graphpool.pool.lockstep import CaptureSync, Decision
    from graphpool.pool.policy import (
        CAPTURE,
        AdmitFrequent,
        CaptureOnMiss,
        Choice,
        ResidencyBook,
        make_policy,
    )
    from graphpool.pool.pool import GraphPool, Route, graphs_off
    from graphpool.pool.stats import FallbackReason, PoolStats

_LAZY = {
    "BucketLadder": "buckets",
    "CAPTURE_ERRORS": "capture",
    "CapturedGraph": "capture",
    "Capturer": "capture",
    "CudaGraphCapturer": "capture",
    "DEFAULT_MISS_POLICY": "config",
    "PoolConfig": "config",
    "CaptureError": "failures",
    "CaptureFailureKind": "failures",
    "InputSpec": "inputs",
    "CaptureSync": "lockstep",
    "Decision": "lockstep",
    "CAPTURE": "policy",
    "AdmitFrequent": "policy",
    "CaptureOnMiss": "policy",
    "Choice": "policy",
    "ResidencyBook": "policy",
    "make_policy": "policy",
    "GraphPool": "pool",
    "Route": "pool",
    "graphs_off": "pool",
    "FallbackReason": "stats",
    "PoolStats": "stats",
}

__all__ = [
    "CAPTURE",
    "CAPTURE_ERRORS",
    "DEFAULT_MISS_POLICY",
    "AdmitFrequent",
    "BucketLadder",
    "CaptureError",
    "CaptureFailureKind",
    "CaptureOnMiss",
    "CaptureSync",
    "CapturedGraph",
    "Capturer",
    "Choice",
    "CudaGraphCapturer",
    "Decision",
    "FallbackReason",
    "GraphPool",
    "InputSpec",
    "PoolConfig",
    "PoolStats",
    "ResidencyBook",
    "Route",
    "graphs_off",
    "make_policy",
]


def __getattr__(name: str) -> Any:
    # NOTE: lazy so that reading a default from graphpool.pool.config (the CLI's --help) does not import torch.
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"graphpool.pool.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'graphpool.pool' has no attribute {name!r}")
