"""Torch's intra-op threads for an engine on the CPU: EngineConfig.cpu_threads, or a default for this machine.

Why the default leaves a core free, with the measurements: docs/benchmarks.md, "CPU threads".
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from graphpool.engine.config import EngineConfig


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_cpu_threads(cores: int, tensor_parallel_size: int = 1) -> int:
    """One core left to the host-side threads (HTTP loop, detokenizing), the rest split over the ranks; at
    least one thread: every OpenMP worker meets at each op's barrier, so one descheduled worker stalls all."""
    return max(1, (cores - 1) // tensor_parallel_size)


def resolve_cpu_threads(config: EngineConfig) -> int | None:
    """Threads for one rank of `config` on the CPU; None where torch's own setting stays: a CUDA device, or
    no cpu_threads given and OMP_NUM_THREADS set (the user's choice for the process)."""
    if config.torch_device.type != "cpu":
        return None
    if config.cpu_threads is not None:
        return config.cpu_threads
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return default_cpu_threads(usable_cores(), config.tensor_parallel_size)


def apply_cpu_threads(config: EngineConfig) -> int:
    """Sets torch's threads for `config` (process-wide) at an engine's start; returns the threads in use."""
    threads = resolve_cpu_threads(config)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()
