"""The engine thread on the GPU: `cuda` without an index (torch.cuda.set_device refuses it) and `cuda:N`
both start the loop, and the thread's current device is the engine's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from graphpool.server.async_engine import AsyncEngine


class IdleEngine:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def has_unfinished_requests(self) -> bool:
        return False


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:last"])
def test_engine_thread_uses_the_engines_cuda_device(name: str) -> None:
    last = torch.cuda.device_count() - 1
    device = torch.device(f"cuda:{last}" if name == "cuda:last" else name)
    expected = torch.cuda.current_device() if device.index is None else device.index
    async_engine = AsyncEngine(IdleEngine(device))
    async_engine.start()
    try:

        def on_thread(_: Any) -> tuple[int, int | None]:
            x = torch.ones(4, device="cuda")  # lands on the thread's current device
            return torch.cuda.current_device(), x.device.index

        current, placed = asyncio.run(async_engine.call(on_thread))
        assert async_engine.error is None and async_engine.is_alive
        assert current == placed == expected
    finally:
        async_engine.shutdown()
