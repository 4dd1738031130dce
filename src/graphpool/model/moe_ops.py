"""The routed experts of a mixture-of-experts MLP, in plain torch ops.

Expert weights are stacked: ``gate_up [E, 2I, H]`` (gate rows first, as SwiGLU's fused projection) and
``down [E, H, I]``. A token's output is the sum over its top-k experts of ``weight * down(silu(gate) * up)``.
Three forms, equal up to float rounding:

- `experts_by_expert` (prefill, eager): the (token, expert) pairs sorted by expert, one host read of the
  per-expert counts, then one SwiGLU over each hit expert's tokens: every weight read once, no wasted FLOPs,
  but a host sync a layer, so it is never captured.
- `experts_gathered` (decode, few tokens): each of the T*k pairs' expert weights gathered into a batch and
  multiplied by one ``bmm``: static shapes, no host sync; it copies T*k experts' weights every step.
- `experts_dense` (decode, more tokens): every expert over every token (one GEMM for gate/up of all experts,
  one batched GEMM for down), the routing weights zero outside each token's top-k: static shapes, no host
  sync; it reads each expert once and does E/k times the routed FLOPs.

`experts_static` picks between the last two by the token count (a host-side shape, fixed per graph).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

__all__ = ["experts_by_expert", "experts_dense", "experts_gathered", "experts_static", "gathers", "route"]

Tensor = torch.Tensor
SiluMul = Callable[[Tensor], Tensor]
Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def route(logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Router logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64): softmax in
    float32, the top k, divided by their sum when `normalize` (transformers' Qwen3-MoE router)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), ids


def experts_by_expert(x: Tensor, gate_up: Tensor, down: Tensor, weights: Tensor, ids: Tensor,
                      silu_mul: SiluMul) -> Tensor:
    """Eager form: each hit expert once, over its tokens; a token's outputs are added in ascending expert
    order (transformers' order)."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()  # the one host sync
    flat_weights = weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // k
        h = F.linear(silu_mul(F.linear(x[tokens], gate_up[expert])), down[expert])
        out.index_add_(0, tokens, h * flat_weights[pairs, None])
    return out


def experts_gathered(x: Tensor, gate_up: Tensor, down: Tensor, weights: Tensor, ids: Tensor,
                     silu_mul: SiluMul) -> Tensor:
    """Capturable form for few tokens: the T*k chosen experts' weights gathered, two batched GEMVs."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    xs = x.unsqueeze(1).expand(tokens, k, x.shape[1]).reshape(tokens * k, x.shape[1], 1)
    h = silu_mul(torch.bmm(gate_up[flat], xs).squeeze(-1))  # [T*k, I]
    y = torch.bmm(down[flat], h.unsqueeze(-1)).view(tokens, k, x.shape[1])
    return torch.bmm(weights.unsqueeze(1), y).squeeze(1)  # the k outputs' weighted sum [T, H]


def experts_dense(x: Tensor, gate_up: Tensor, down: Tensor, weights: Tensor, ids: Tensor,
                  silu_mul: SiluMul, linear: Linear = F.linear) -> Tensor:
    """Capturable form for more tokens: all experts over all tokens; the routing weights (zero off the top-k)
    scale each expert's SwiGLU output before its down projection, so unrouted experts add exact zeros."""
    num_experts, two_i, hidden = gate_up.shape
    tokens = x.shape[0]
    h = linear(x, gate_up.view(num_experts * two_i, hidden), None)  # [T, E * 2I]: one GEMM
    h = silu_mul(h.view(tokens * num_experts, two_i)).view(tokens, num_experts, two_i // 2)
    dense = torch.zeros(tokens, num_experts, dtype=weights.dtype, device=weights.device).scatter_(1, ids, weights)
    h = h * dense.unsqueeze(-1)
    y = torch.bmm(h.transpose(0, 1), down.transpose(1, 2))  # [E, T, H]
    return y.sum(dim=0)


def gathers(tokens: int, num_experts: int, top_k: int) -> bool:
    """Whether `experts_static` gathers: its gathered copy and read of 3 * T * k experts' weights is below the
    dense form's one read of all E (and its E/k-fold FLOPs)."""
    return 3 * tokens * top_k <= num_experts


def experts_static(x: Tensor, gate_up: Tensor, down: Tensor, weights: Tensor, ids: Tensor,
                   silu_mul: SiluMul, linear: Linear = F.linear) -> Tensor:
    """The decode step's form: no host sync and shapes that depend on T alone (CUDA-graph capturable)."""
    if gathers(x.shape[0], gate_up.shape[0], ids.shape[1]):
        return experts_gathered(x, gate_up, down, weights, ids, silu_mul)
    return experts_dense(x, gate_up, down, weights, ids, silu_mul, linear)
