"""A small decode step of our own (embedding, residual MLPs, a KV write, logits) to exercise the pool
without a real model: used by the memory probe, the GPU tests and examples/pool_example.py."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from graphpool.pool.pool import InputSpec

# NOTE: slot 0 is the dummy KV slot: padded rows write it, live rows never use it.
TOY_SPECS = (
    InputSpec("input_ids", (), torch.int64, pad_value=0),
    InputSpec("slot_mapping", (), torch.int64, pad_value=0),
)


class ToyDecode(nn.Module):
    """``forward(static) -> logits [bs, vocab]``; writes each row's hidden state to ``kv[slot]``.

    Every row is computed from its own inputs only, so padded rows can never change live rows.
    """

    def __init__(
        self,
        vocab: int = 4096,
        hidden: int = 512,
        layers: int = 2,
        slots: int = 1024,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, hidden, generator=gen) * 0.5, requires_grad=False)
        self.w_up = nn.ParameterList(
            nn.Parameter(torch.randn(hidden, 4 * hidden, generator=gen) / hidden**0.5, requires_grad=False)
            for _ in range(layers)
        )
        self.w_down = nn.ParameterList(
            nn.Parameter(torch.randn(4 * hidden, hidden, generator=gen) / (4 * hidden) ** 0.5, requires_grad=False)
            for _ in range(layers)
        )
        self.head = nn.Parameter(torch.randn(hidden, vocab, generator=gen) / hidden**0.5, requires_grad=False)
        self.register_buffer("kv", torch.zeros(slots, hidden))
        self.to(device=device, dtype=dtype)

    def forward(self, s: Mapping[str, torch.Tensor]) -> torch.Tensor:
        h = self.embed[s["input_ids"]]  # [bs, hidden]
        for up, down in zip(self.w_up, self.w_down, strict=True):
            h = h + torch.nn.functional.silu(h @ up) @ down  # [bs, 4*hidden] activation in between
        self.kv.index_copy_(0, s["slot_mapping"], h)  # the "KV write"
        return (h + self.kv[s["slot_mapping"]]) @ self.head  # [bs, vocab]

    def inputs(self, bs: int, seed: int = 0, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
        """Fresh random live inputs: distinct slots >= 1 (never the dummy slot)."""
        gen = torch.Generator().manual_seed(seed)
        dev = device if device is not None else self.kv.device
        ids = torch.randint(0, self.embed.shape[0], (bs,), generator=gen)
        slots = torch.randperm(self.kv.shape[0] - 1, generator=gen)[:bs] + 1
        return {"input_ids": ids.to(dev), "slot_mapping": slots.to(dev)}
