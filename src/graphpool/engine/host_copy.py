"""A host list on the device without waiting for the stream: through pinned memory on CUDA, since a plain
(pageable) copy waits for the work already queued (under async scheduling: the decode step in flight)."""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pin = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pin).to(device, non_blocking=pin)


def tensor_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`to_device` of a host tensor (pinned first on CUDA)."""
    pin = device.type == "cuda"
    return (host.pin_memory() if pin else host).to(device, non_blocking=pin)
