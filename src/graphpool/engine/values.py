"""Setting values read the same way everywhere: byte sizes (`512MiB`) and devices (`auto`, `cuda:1`)."""

from __future__ import annotations

import re

import torch

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(value: int | str) -> int:
    """`2147483648`, `"512MiB"`, `"2GiB"`, `"1.5GB"` -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ValueError(f"a byte size must be an int or a string like '512MiB', got {value!r}")
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {value!r} as a byte size (examples: 1073741824, 512MiB, 2GiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def resolve_device(device: str) -> torch.device:
    """`auto`, `cpu`, `cuda` or `cuda:N` -> a torch.device; a CUDA device always carries its index.

    NOTE: the index matters: `torch.cuda.set_device` (the server's engine thread) refuses an index-less
    device, and the pool keys its capture stream by index.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cpu":
        return dev
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available on this machine")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= count:
        raise ValueError(f"device {device!r} asked for, but this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)
