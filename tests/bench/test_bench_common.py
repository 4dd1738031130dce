"""The benchmarks read --device and --dtype as the engine does."""

from __future__ import annotations

import pytest
import torch

from graphpool.bench.common import device_and_dtype


def test_bench_device_and_dtype_are_the_engines() -> None:
    assert device_and_dtype("cpu", "auto") == (torch.device("cpu"), torch.float32)
    assert device_and_dtype("cpu", "bf16") == (torch.device("cpu"), torch.bfloat16)
    assert device_and_dtype("cpu", "float16")[1] == torch.float16
    with pytest.raises(ValueError, match="dtype must be one of"):
        device_and_dtype("cpu", "int8")
    with pytest.raises(ValueError, match="device must be"):
        device_and_dtype("tpu", "auto")


def test_a_bench_cuda_device_carries_its_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert device_and_dtype("cuda", "auto") == (torch.device("cuda", 1), torch.bfloat16)
    assert device_and_dtype("auto", "fp32") == (torch.device("cuda", 1), torch.float32)
