"""One tensor-parallel rank's set-up, shared by rank 0 (inside `LLMEngine`) and the other ranks (`tp_worker`).

Every rank runs the same collectives in the same order: join the group, load its shard, agree on the number
of KV blocks, warm the graph pool up (each capture ends with an agreement), then one forward per step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.kv_cache import choose_num_blocks
from graphpool.model.config import ModelConfig
from graphpool.model.parallel import rank_config, shard_model
from graphpool.model.tp_group import TPGroup
from graphpool.pool.lockstep import CaptureSync


def join_group(config: EngineConfig, rank: int, init_method: str) -> TPGroup:
    """Joins the ranks' process group (NCCL on GPUs, gloo on the CPU) as `rank`: it waits for all of them."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("tensor_parallel_size > 1 starts its own torch.distributed process group, but this "
                           "process already has one (destroy it first)")
    device = torch.device(config.rank_device(rank))
    extra: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    # NOTE: NVLink multicast (NVLS) off unless asked for: on shared multi-GPU hosts a program using it can put
    # the GPUs out of service; NCCL's ring/tree all-reduce needs none of it
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=config.tensor_parallel_size, **extra)
    return TPGroup(rank, config.tensor_parallel_size)


LoadedModel = tuple[Any, ModelConfig, Any]  # (model, config, tokenizer or None), as load_model returns


def load_model_for(config: EngineConfig, device: torch.device) -> LoadedModel:
    """The config's whole model on `device` (random weights from the config's seed)."""
    from graphpool.model.loader import load_model

    return load_model(config.model, device, config.torch_dtype, config.resolved_attn_backend,  # type: ignore[arg-type]
                      seed=config.seed, max_positions=config.max_model_len, disabled_kernels=config.disabled_kernels,
                      revision=config.revision, download_dir=config.download_dir,
                      tokenizer_cache=config.tokenizer_cache, int4=bool(config.int4_weights))


def load_shard(config: EngineConfig, tp: TPGroup) -> LoadedModel:
    """The model, loaded whole on this rank's device (every rank the same weights: random ones from the same
    seed) and cut down to its shard; (model, full architecture, tokenizer)."""
    model, model_config, tokenizer = load_model_for(config, torch.device(config.rank_device(tp.rank)))
    return shard_model(model, tp), model_config, tokenizer


def _all_reduce(tp: TPGroup, values: Sequence[int], op: str, device: torch.device) -> list[int]:
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=tp.group)
    return [int(v) for v in t.tolist()]


def num_kv_blocks(config: EngineConfig, model_config: ModelConfig, tp: TPGroup, device: torch.device) -> int:
    """KV blocks of this rank's cache (its KV heads), the same on every rank: the fewest any rank can hold."""
    n = choose_num_blocks(
        rank_config(model_config, tp.world_size), block_size=config.block_size, dtype=config.torch_dtype,
        device=device, kv_cache_fraction=config.kv_cache_fraction, max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len, num_kv_blocks=config.num_kv_blocks,
    )
    return n if tp.world_size == 1 else _all_reduce(tp, [n], "MIN", device)[0]


def capture_sync(tp: TPGroup, device: torch.device) -> CaptureSync:
    """The pool's agreement after each capture: an element-wise max over the ranks (on the device for NCCL)."""

    def sync(values: Sequence[int]) -> list[int]:
        return _all_reduce(tp, values, "MAX", device)

    return sync
