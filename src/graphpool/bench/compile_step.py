"""The step bench's torch.compile column: `torch.compile(mode="reduce-overhead")` of the decode step.

NOTE: it compiles the plain-PyTorch-ops twin of the benched model (attn_backend="torch", the same seeded
random weights, sharing the same KV cache and inputs), not the Triton one: inductor re-compiles user-defined
Triton kernels itself, and on the H200 (torch 2.11, triton 3.6) that fails at every size on our decode
attention ("Loop-carried variable m_i has initial type fp32 but is re-assigned to fp64"). A compile
failure is still a result: it is recorded in the row, never raised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from graphpool.bench import common
from graphpool.bench.common import median, progress
from graphpool.bench.decode import DecodeSetup, StepFn, build_random_model, model_label
from graphpool.bench.step_config import StepBenchConfig, StepRow
from graphpool.model.config import ModelConfig

COMPILE_NOTE = ("torch.compile(mode=\"reduce-overhead\") of the same step built from plain PyTorch ops "
                "(attn_backend=\"torch\", the same random weights, KV cache and inputs): inductor cannot "
                "compile our Triton decode-attention kernel (torch 2.11 / triton 3.6: fp32 vs fp64 "
                "loop-carried type error)")


def plain_ops_setup(model: str | ModelConfig, device: torch.device, dtype: torch.dtype,
                    cfg: StepBenchConfig) -> DecodeSetup:
    """The step bench's decode setup rebuilt over plain torch ops: the same seeded random weights, KV cache
    contents and inputs as the Triton run (the same seeds and shapes), only attn_backend="torch"."""
    m = build_random_model(model, device, dtype, "torch", max_positions=cfg.context_len + 16)
    return DecodeSetup.create(m, max(cfg.batch_sizes), cfg.context_len, cfg.block_size)


def mark_kv_static(setup: DecodeSetup) -> None:
    """The step writes the KV cache in place: marked as static addresses (like parameters), so cudagraph
    trees may record the mutation instead of skipping the graph for a mutated input."""
    import torch._dynamo

    for k, v in setup.kv_caches:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)


def compile_step(step: StepFn, static: dict[str, torch.Tensor], row: StepRow, warmup: int, reps: int) -> None:
    """Times `step` eagerly, then compiled; fills the row's compile fields (or its compile_error)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    device = static["input_ids"].device
    ref = step(static).clone()
    row.torch_ops_eager_ms = median(common.time_ms(lambda: step(static), device, warmup, reps))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)

    def call() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(static)

    try:
        t0 = time.perf_counter()
        for _ in range(3):  # reduce-overhead records its graphs on the first calls after compiling
            out = call()
        common.sync(device)
        row.compile_s = time.perf_counter() - t0
        row.compile_rel_err = common.rel_err(out.clone(), ref)
        row.compile_ms = median(common.time_ms(call, device, warmup, reps))
        row.compile_cudagraph_skips = int(counters["inductor"]["cudagraph_skips"])
    except Exception as exc:  # NOTE: a compile failure is a result to report, not a reason to lose the run
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        row.compile_error = f"{type(exc).__name__}: {first}"
        progress(f"  torch.compile failed at bs={row.batch_size}: {row.compile_error}")
    finally:
        torch._dynamo.reset()
    if math.isfinite(row.compile_ms):
        progress(f"  bs={row.batch_size}: torch.compile {row.compile_ms:.2f} ms/step after {row.compile_s:.1f} s "
                 f"(plain-ops eager {row.torch_ops_eager_ms:.2f} ms, rel err {row.compile_rel_err:.1e}, "
                 f"cudagraph skips {row.compile_cudagraph_skips})")


@torch.inference_mode()
def compile_model(model: str | ModelConfig, cfg: StepBenchConfig, device: torch.device, dtype: torch.dtype,
                  rows: dict[int, StepRow], save: Callable[[], None] = lambda: None) -> None:
    """torch.compile at each of cfg.compile_sizes that has a row; `save` after each size."""
    sizes = [bs for bs in cfg.compile_sizes if bs in rows]
    if not sizes:
        return
    setup = plain_ops_setup(model, device, dtype, cfg)
    mark_kv_static(setup)
    progress(f"{model_label(model)}: torch.compile of the plain-torch-ops step at bs {sizes}")
    step = setup.step_fn()
    for bs in sizes:
        compile_step(step, setup.batch(bs), rows[bs], cfg.warmup, cfg.reps)
        save()
