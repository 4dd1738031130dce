"""`HostStaging`: a step's host arrays reach the device in one copy, as tensors of their own dtypes and shapes
(strided inputs included), and a later staging never changes an earlier step's tensors. The GPU side (pinned
buffers reused while earlier copies are still queued) is in tests/gpu/test_engine_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphpool.engine.host_copy import HostStaging

CPU = torch.device("cpu")


def test_arrays_come_back_with_their_dtypes_shapes_and_values() -> None:
    table = np.arange(24, dtype=np.int32).reshape(4, 6)
    arrays = [np.array([3, -1, 2**40], dtype=np.int64), np.array([7], dtype=np.int32), table[:, :5],
              np.array([0.5, -2.25], dtype=np.float32), np.zeros((0, 3), dtype=np.int32)]
    out = HostStaging(CPU).to_device(*arrays)
    for a, t in zip(arrays, out, strict=True):
        assert t.dtype == {np.int64: torch.int64, np.int32: torch.int32, np.float32: torch.float32}[a.dtype.type]
        assert tuple(t.shape) == a.shape
        assert np.array_equal(t.numpy(), a)


def test_a_later_staging_leaves_earlier_tensors_alone() -> None:
    staging = HostStaging(CPU, num_buffers=2)
    kept = [staging.to_device(np.full(5, i, dtype=np.int64))[0] for i in range(7)]
    assert [t.tolist() for t in kept] == [[i] * 5 for i in range(7)]


def test_a_buffer_grows_for_a_larger_step() -> None:
    staging = HostStaging(CPU, num_buffers=1)
    assert staging.to_device(np.ones(3, dtype=np.int64))[0].tolist() == [1, 1, 1]
    big = np.arange(5000, dtype=np.int64)
    assert torch.equal(staging.to_device(big)[0], torch.from_numpy(big))


def test_other_dtypes_are_refused() -> None:
    with pytest.raises(TypeError, match="float64"):
        HostStaging(CPU).to_device(np.ones(2, dtype=np.float64))
