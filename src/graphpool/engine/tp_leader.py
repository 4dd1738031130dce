"""Rank 0's side of tensor parallelism: start ranks 1..N-1, send them each step's batch, stop them.

`LLMEngine` runs rank 0 in its own process (the scheduler, the sampler and rank 0's shard); `TPLeader` starts
the other ranks with torch.multiprocessing (spawn, one process per rank, `tp_worker.worker_main`), one pipe
each. Each step, before rank 0's forward, the runner's announcer sends the batch (tp_messages) down every
pipe, so all ranks enter the forward's collectives together.

A rank that dies is reported with its rank, pid and exit code: at start-up while waiting for it, and at the
next step (`WorkerDiedError`). NOTE: a rank that dies inside a collective makes gloo raise on the others at
once, while NCCL waits for its timeout (10 min by default); an exception on rank 0 inside a forward leaves
the ranks out of step: close the engine and start a new one in either case.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch.multiprocessing as mp

from graphpool.engine.config import EngineConfig
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.scheduler import PrefillChunk
from graphpool.engine.tp_messages import prefill_message
from graphpool.engine.tp_rank import join_group
from graphpool.engine.tp_worker import worker_main
from graphpool.model.loader import model_config
from graphpool.model.parallel import check_shardable
from graphpool.pool import PoolStats
from graphpool.pool.capture import Capturer
from graphpool.pool.lockstep import Decision

log = logging.getLogger(__name__)
START_TIMEOUT_S = 900.0  # a rank's model load (real weights) or graph warm-up may take minutes
STOP_TIMEOUT_S = 10.0


class WorkerDiedError(RuntimeError):
    """A tensor-parallel rank's process is gone: the engine cannot step any more."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[Any], conns: list[Connection]) -> None:
    """Asks every rank to stop, waits, kills what is left, and leaves rank 0's process group."""
    import torch.distributed as dist

    for conn in conns:
        with contextlib.suppress(OSError):  # a rank already gone
            conn.send(("stop",))
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            log.warning("tensor-parallel rank process %d did not stop in %.0f s: killing it", p.pid, STOP_TIMEOUT_S)
            p.kill()
            p.join(STOP_TIMEOUT_S)
    for conn in conns:
        conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()


class TPLeader:
    """Starts ranks 1..N-1 of `config` and joins their process group as rank 0 (`self.tp`); first, a
    ValueError unless the model's heads and MLP width divide over the N ranks.

    `capturer` (tests: `graphpool.pool.testing.EagerCapturer`) is pickled to every rank."""

    def __init__(self, config: EngineConfig, capturer: Capturer | None = None) -> None:
        self.world_size = config.tensor_parallel_size
        check_shardable(model_config(config.model, revision=config.revision, download_dir=config.download_dir),
                        self.world_size)  # NOTE: reads the model's config file only
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            for rank in range(1, self.world_size):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=worker_main, args=(rank, config, init_method, theirs, capturer),
                                   name=f"graphpool-tp-rank{rank}", daemon=True)
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._conns.append(ours)
            self.wait_for("hello")
            self.tp = join_group(config, 0, init_method)
        except BaseException:
            self.close()
            raise

    # ---- start-up ------------------------------------------------------------------------------------
    def wait_for(self, stage: str, timeout: float = START_TIMEOUT_S) -> None:
        """Until every rank reported `stage` ("hello", "loaded", "ready"); raises with a failed rank's
        traceback, or if one died or took longer than `timeout`."""
        pending = dict(enumerate(self._conns, start=1))
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait([*pending.values(), *(self._procs[r - 1].sentinel for r in pending)],
                         max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"tensor-parallel ranks {sorted(pending)} did not report {stage!r} in {timeout:.0f} s")
            for rank, conn in list(pending.items()):
                if conn in ready or conn.poll():
                    try:
                        kind, detail = conn.recv()
                    except EOFError:  # its end closed without a word: the process is gone
                        raise self._died(rank) from None
                    if kind == "error":
                        raise RuntimeError(f"tensor-parallel rank {rank} failed while starting:\n{detail}")
                    if kind != stage:
                        raise RuntimeError(f"tensor-parallel rank {rank} said {kind!r}, expected {stage!r}")
                    del pending[rank]
                elif self._procs[rank - 1].sentinel in ready:  # NOTE: after the poll: its last words first
                    raise self._died(rank)

    # ---- steps ---------------------------------------------------------------------------------------
    def announcer(self, block_manager: BlockManager) -> _Announcer:
        """The runner's `announce` hook on rank 0 (`ModelRunner.announce`)."""
        return _Announcer(self, block_manager)

    def send(self, message: tuple[object, ...]) -> None:
        self.check_alive()
        for rank, conn in enumerate(self._conns, start=1):
            try:
                conn.send(message)
            except OSError as e:
                raise self._died(rank) from e

    def pool_stats(self) -> list[PoolStats | None]:
        """Ranks 1..N-1's graph pool stats (between steps)."""
        self.send(("stats",))
        out: list[PoolStats | None] = []
        for rank, conn in enumerate(self._conns, start=1):
            try:
                kind, stats = conn.recv()
            except EOFError as e:
                raise self._died(rank) from e
            if kind != "stats":
                raise RuntimeError(f"tensor-parallel rank {rank} answered {kind!r} to a stats request")
            out.append(stats)
        return out

    def check_alive(self) -> None:
        for rank, proc in enumerate(self._procs, start=1):
            if proc.exitcode is not None:
                raise self._died(rank)
        if not self._finalizer.alive:
            raise RuntimeError("the tensor-parallel ranks were stopped (engine closed)")

    def _died(self, rank: int) -> WorkerDiedError:
        proc = self._procs[rank - 1]
        proc.join(STOP_TIMEOUT_S)  # NOTE: its pipe closes before the process has exited
        how = "still exiting" if proc.exitcode is None else f"exit code {proc.exitcode}"
        last_words = ""
        conn = self._conns[rank - 1]
        with contextlib.suppress(EOFError, OSError):  # nothing (more) to read from a dead rank
            while conn.poll():
                kind, detail = conn.recv()
                if kind == "error":
                    last_words = f":\n{detail}"
        err = WorkerDiedError(
            f"tensor-parallel rank {rank} (pid {proc.pid}) died ({how}); this engine cannot step any more: close "
            f"it and start a new one{last_words}"
        )
        log.error("%s", err)
        return err

    def close(self) -> None:
        """Stops the ranks and leaves the process group (idempotent)."""
        self._finalizer()


class _Announcer:
    def __init__(self, leader: TPLeader, block_manager: BlockManager) -> None:
        self.leader = leader
        self.block_manager = block_manager

    def prefill(self, chunks: list[PrefillChunk]) -> None:
        self.leader.send(prefill_message(chunks, self.block_manager))

    def decode(self, last_tokens: list[int] | None, lens: list[int], slots: list[int], rows: np.ndarray,
               decision: Decision) -> None:
        self.leader.send(("decode", last_tokens, lens, slots, rows, decision))
