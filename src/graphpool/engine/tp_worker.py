"""Tensor-parallel ranks 1..N-1: a process that holds one shard and runs the forward rank 0 sends it.

Started by `tp_leader.TPLeader` (torch.multiprocessing, spawn). It sets up in the order `LLMEngine` does on
rank 0 (tp_rank), then runs each step message (tp_messages) through its own `ModelRunner`: the same code
builds the same inputs, every rank attends over its own heads, and its graph pool applies rank 0's decision.
It samples nothing: rank 0 holds the whole logits after the vocab gather.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import traceback
from multiprocessing.connection import Connection
from typing import cast

import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.cpu_threads import apply_cpu_threads
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.runner import ModelRunner
from graphpool.engine.tp_messages import BlockTableView
from graphpool.engine.tp_rank import capture_sync, join_group, load_shard, num_kv_blocks
from graphpool.pool.capture import Capturer
from graphpool.pool.gc_control import collect_and_freeze


def worker_main(rank: int, config: EngineConfig, init_method: str, conn: Connection,
                capturer: Capturer | None) -> None:
    """The process's entry point: report any failure to rank 0, then exit with status 1."""
    try:
        _serve(rank, config, init_method, conn, capturer)
    except EOFError:
        return  # NOTE: rank 0 closed its end (it stopped or died): nothing is left to serve
    except BaseException:
        text = traceback.format_exc()
        print(f"graphpool tensor-parallel rank {rank} failed:\n{text}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # rank 0 may be gone already
            conn.send(("error", text))
        raise SystemExit(1) from None


@torch.inference_mode()
def _serve(rank: int, config: EngineConfig, init_method: str, conn: Connection,
           capturer: Capturer | None) -> None:
    import torch.distributed as dist

    # NOTE: this rank's own settings: its device, and one rank (what the runner and the pool see)
    local = dataclasses.replace(config, device=config.rank_device(rank), tensor_parallel_size=1)
    device = local.torch_device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        apply_cpu_threads(config)
    conn.send(("hello", None))
    tp = join_group(config, rank, init_method)
    try:
        model, model_config, _ = load_shard(config, tp)
        conn.send(("loaded", None))
        kv_caches = model.allocate_kv_caches(num_kv_blocks(local, model_config, tp, device), local.block_size)
        tables = BlockTableView(local.block_size)
        runner = ModelRunner(model, kv_caches, local, cast(BlockManager, tables), capturer,
                             capture_sync(tp, device))
        runner.warmup(local.graph_warmup)
        collect_and_freeze()  # the start-up's objects live as long as this rank: no collection walks them again
        conn.send(("ready", None))
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "prefill":
                tables.update(message[2])
                runner.prefill(message[1])
            elif kind == "decode":
                runner.decode_rows(*message[1:])
            elif kind == "stats":
                conn.send(("stats", runner.pool.stats() if runner.pool.graphs_off is None else None))
            elif kind == "stop":
                return
            else:
                raise ValueError(f"unknown step message {kind!r}")
    finally:
        dist.destroy_process_group()
