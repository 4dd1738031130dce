"""graphpool.pool: a bounded, memory-honest pool of CUDA graphs for any decode step.

Imports nothing from graphpool.engine, graphpool.model or graphpool.server.
"""

from graphpool.pool.buckets import BucketLadder
from graphpool.pool.capture import CAPTURE_ERRORS, CapturedGraph, Capturer, CudaGraphCapturer
from graphpool.pool.config import DEFAULT_MISS_POLICY, PoolConfig
from graphpool.pool.failures import CaptureError, CaptureFailureKind
from graphpool.pool.inputs import InputSpec
from graphpool.pool.lockstep import CaptureSync, Decision
from graphpool.pool.policy import CAPTURE, AdmitFrequent, CaptureOnMiss, Choice, ResidencyBook, make_policy
from graphpool.pool.pool import GraphPool, Route, graphs_off
from graphpool.pool.stats import FallbackReason, PoolStats

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
