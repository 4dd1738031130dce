"""The tensor-parallel group a model shard runs in, and the step's two collectives on it.

A `TPGroup` is this process's rank, the number of ranks and the torch.distributed process group (NCCL on
GPUs, gloo on the CPU). With one rank every collective is the identity and nothing of torch.distributed is
touched, so the single-rank model never pays for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["SINGLE", "Pending", "TPGroup"]


class Pending(Protocol):
    """A collective in flight (torch.distributed's Work): `wait()` before reading its tensor."""

    def wait(self) -> Any: ...


class _Done:
    def wait(self) -> None:
        return None


DONE: Pending = _Done()


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world_size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup (None: the default group)

    def __post_init__(self) -> None:
        if not (isinstance(self.world_size, int) and self.world_size >= 1):
            raise ValueError(f"world_size must be an int >= 1, got {self.world_size!r}")
        if not (isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank!r}")

    def split(self, n: int, what: str = "size") -> slice:
        """This rank's contiguous share of `n` items (`n` must divide evenly)."""
        if n % self.world_size:
            raise ValueError(f"{what} {n} does not divide over {self.world_size} tensor-parallel ranks")
        share = n // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, in place (the row-parallel layers' partial sums)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_reduce_async(self, x: torch.Tensor) -> Pending:
        """Start the sum of `x` over the ranks, in place; `x` holds it once `wait()` returned. With NCCL the
        collective runs on its own stream and `wait()` makes the current stream wait for it (inside a graph
        capture both are captured), so work issued in between overlaps it; with gloo it runs on a thread."""
        if self.world_size == 1:
            return DONE
        import torch.distributed as dist

        return dist.all_reduce(x, group=self.group, async_op=True)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place (stream-ordered on NCCL: no host sync)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.broadcast(x, src=src, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """`x [..., n]` of every rank -> `[..., world_size * n]`, rank 0's columns first (vocab shards)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        lead, n = x.shape[:-1], x.shape[-1]
        rows = x.reshape(-1, n).contiguous()
        out = torch.empty((self.world_size * rows.shape[0], n), device=x.device, dtype=x.dtype)
        # NOTE: torch 2.13 renames all_gather_into_tensor (the GPU machine's 2.11 has only the old name); the
        # concatenated output form, which gloo supports too
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, rows, group=self.group)
        return out.view(self.world_size, rows.shape[0], n).transpose(0, 1).reshape(*lead, self.world_size * n)


SINGLE = TPGroup()
