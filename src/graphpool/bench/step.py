"""`graphpool bench step`: one decode step per batch size — eager, graph replay, the pool's run,
torch.compile(mode="reduce-overhead") — against the HBM floor measured in the same run."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from graphpool.bench import common
from graphpool.bench.common import md_table, median, progress, ratio
from graphpool.bench.compile_step import COMPILE_NOTE, compile_model
from graphpool.bench.decode import DecodeSetup, build_random_model, model_label, setup_input_specs
from graphpool.bench.engine_step import engine_step_ms
from graphpool.bench.step_config import DEFAULT_SIZES, StepBenchConfig, StepRow
from graphpool.model.config import ModelConfig


def _pool_times(setup: DecodeSetup, sizes: Sequence[int], cfg: StepBenchConfig) -> dict[int, tuple[float, float]]:
    """{bs: (pool.run median ms, capture seconds)} through one GraphPool holding every size."""
    from graphpool.pool import GraphPool, PoolConfig

    pc = PoolConfig(
        batch_sizes=tuple(sorted(sizes)),
        max_graph_pool_size=len(sizes),
        max_len_in_batch=setup.context_len,
        mempool="shared",
        miss_policy="capture",
    )
    step = setup.step_fn()
    pool = GraphPool(step, setup_input_specs(setup), pc, setup.model.device)
    out: dict[int, tuple[float, float]] = {}
    try:
        for bs in sorted(sizes):
            inputs = setup.batch(bs)
            before = pool.stats().capture_seconds_total
            pool.run(inputs, max_len_in_batch=setup.context_len)  # the miss captures
            cap = pool.stats().capture_seconds_total - before
            ms = median(common.time_ms(lambda inputs=inputs: pool.run(inputs, max_len_in_batch=setup.context_len),
                                       setup.model.device, cfg.warmup, cfg.reps))
            out[bs] = (ms, cap)
        stats = pool.stats()
        if stats.eager_steps:
            progress(f"  note: the pool ran {stats.eager_steps} eager steps ({stats.as_dict()['fallbacks']})")
    finally:
        pool.close()
    return out


@torch.inference_mode()
def bench_model(
    model: str | ModelConfig,
    cfg: StepBenchConfig,
    device: torch.device,
    dtype: torch.dtype,
    bandwidth: float,
    rows: list[StepRow],
    save: Callable[[], None] = lambda: None,
) -> dict[int, StepRow]:
    """Appends one row per batch size to `rows` (and returns them by batch size); calls `save` after each
    phase (eager + graph, pool), so a run cut short keeps what it measured. torch.compile is not here: it
    runs after every model's other numbers (compile_step.compile_model), being the slow, risky part."""
    label = model_label(model)
    max_bs = max(cfg.batch_sizes)
    t0 = time.perf_counter()
    m = build_random_model(model, device, dtype, cfg.attn_backend, max_positions=cfg.context_len + 16)
    setup = DecodeSetup.create(m, max_bs, cfg.context_len, cfg.block_size)
    progress(f"{label}: model + KV cache ({max_bs} x {cfg.context_len} tokens) ready in "
             f"{time.perf_counter() - t0:.1f} s, attention backend {m.attn_backend}")
    step = setup.step_fn()
    cuda = device.type == "cuda"
    mine: dict[int, StepRow] = {}
    for bs in cfg.batch_sizes:
        static = setup.batch(bs)
        row = StepRow(model=label, batch_size=bs, eager_ms=math.nan)
        row.weight_bytes, row.kv_bytes = setup.weight_bytes_read(bs), setup.kv_bytes_read(bs)
        row.floor_ms = (row.weight_bytes + row.kv_bytes) / bandwidth * 1e3
        eager_out = step(static).clone()
        row.eager_ms = median(common.time_ms(lambda static=static: step(static), device, cfg.warmup, cfg.reps))
        if cuda:
            graph, out, cap_s = common.capture_graph(lambda static=static: step(static))
            graph.replay()
            row.graph_rel_err = common.rel_err(out, eager_out)
            row.capture_ms = cap_s * 1e3
            row.graph_ms = median(common.time_ms(graph.replay, device, cfg.warmup, cfg.reps))
            del graph, out
        else:
            row.notes.append("graphs and torch.compile need CUDA: eager only")
        row.speedup = ratio(row.eager_ms, row.graph_ms)
        row.graph_over_floor = ratio(row.graph_ms, row.floor_ms)
        progress(f"  {label} bs={bs}: eager {row.eager_ms:.2f} ms, graph {row.graph_ms:.2f} ms "
                 f"(x{row.speedup:.1f}), floor {row.floor_ms:.2f} ms")
        rows.append(row)
        mine[bs] = row
    save()
    for bs in (b for b in cfg.batch_sizes if b in cfg.engine_sizes):
        mine[bs].engine_ms = engine_step_ms(m, m.config, bs, cfg, async_scheduling=False)
        mine[bs].engine_async_ms = engine_step_ms(m, m.config, bs, cfg, async_scheduling=True)
        progress(f"  {label} bs={bs}: engine step {mine[bs].engine_ms:.3f} ms, async {mine[bs].engine_async_ms:.3f}"
                 f" ms (graph replay {mine[bs].graph_ms:.3f} ms)")
        save()
    if not cuda:
        return mine
    if cfg.use_pool:
        for bs, (ms, cap) in _pool_times(setup, cfg.batch_sizes, cfg).items():
            mine[bs].pool_ms = ms
            mine[bs].notes.append(f"pool capture {cap * 1e3:.0f} ms (warm-up + capture)")
        progress(f"  {label}: pool.run timed at {len(cfg.batch_sizes)} sizes")
        save()
    return mine


def markdown(rows: Sequence[StepRow], bandwidth: float, cfg: StepBenchConfig) -> str:
    out = [f"HBM bandwidth (device-to-device copy, read + write bytes): **{bandwidth / 1e12:.2f} TB/s**. "
           f"Context {cfg.context_len} tokens per sequence; medians of {cfg.reps} CUDA-event timings.\n"]
    for label in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == label]
        out.append(f"\n## {label}\n\n")
        out.append(md_table(
            ["bs", "eager ms", "graph ms", "pool.run ms", "compile ms (plain ops)", "floor ms", "graph speed-up",
             "graph/floor", "capture ms", "graph rel err"],
            [[r.batch_size, r.eager_ms, r.graph_ms, r.pool_ms, r.compile_ms, r.floor_ms, r.speedup,
              r.graph_over_floor, r.capture_ms, r.graph_rel_err] for r in mine],
        ))
        eng = [r for r in mine if not math.isnan(r.engine_ms)]
        if eng:
            out.append("\nThe engine's whole decode step (scheduling, inputs, replay, sampling, outputs; median wall "
                       "ms), synchronous and with async scheduling, against the graph replay alone (the "
                       "target: <= 1.05x at bs 1):\n\n")
            out.append(md_table(
                ["bs", "engine ms", "engine async ms", "graph ms", "engine/graph", "async/graph", "async/engine"],
                [[r.batch_size, r.engine_ms, r.engine_async_ms, r.graph_ms, ratio(r.engine_ms, r.graph_ms),
                  ratio(r.engine_async_ms, r.graph_ms), ratio(r.engine_async_ms, r.engine_ms)] for r in eng],
            ))
        comp = [r for r in mine if not math.isnan(r.compile_s) or r.compile_error]
        if comp:
            out.append(f"\n{COMPILE_NOTE}; its eager time is shown next to it:\n\n")
            out.append(md_table(
                ["bs", "compile s", "compiled ms", "plain-ops eager ms", "graph ms (Triton)", "compiled rel err",
                 "cudagraph skips", "error"],
                [[r.batch_size, r.compile_s, r.compile_ms, r.torch_ops_eager_ms, r.graph_ms, r.compile_rel_err,
                  r.compile_cudagraph_skips, r.compile_error or ""] for r in comp],
            ))
    return "".join(out)


def run_step_bench(cfg: StepBenchConfig, out_dir: Path, argv: Sequence[str] | None = None) -> dict[str, object]:
    device, dtype = common.device_and_dtype(cfg.device, cfg.dtype)
    env = common.collect_env(argv, device)
    print(env.header_markdown(), flush=True)
    progress(f"step bench on {env.gpu}, torch {env.torch_version}, dtype {dtype}")
    bandwidth = common.measure_hbm_bandwidth(device, nbytes=(2 << 30) if device.type == "cuda" else (64 << 20))
    progress(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    rows: list[StepRow] = []
    results: dict[str, object] = {"config": cfg, "bandwidth_bytes_per_s": bandwidth, "dtype": str(dtype), "rows": rows}
    body = ""

    def save() -> None:
        nonlocal body
        from graphpool.bench.plots import plot_step

        png = plot_step(rows, out_dir / "step.png")
        body = markdown(rows, bandwidth, cfg) + f"\n![step time per batch size]({png.name})\n"
        common.write_report(out_dir, "step", env, results, body, "Decode step: eager vs graph vs compile vs HBM floor")

    by_model = []
    for model in cfg.models:
        by_model.append(bench_model(model, cfg, device, dtype, bandwidth, rows, save))
        common.free_device_memory(device)  # the model and its KV cache died with bench_model's frame
    if device.type == "cuda":
        # NOTE: every model's eager/graph/pool numbers are saved before the first compile (minutes, can fail)
        for model, mine in zip(cfg.models, by_model, strict=True):
            compile_model(model, cfg, device, dtype, mine, save)
            common.free_device_memory(device)
    print(body)
    return results


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=list(StepBenchConfig.models), help="random-weight presets")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    p.add_argument("--compile-sizes", type=int, nargs="*", default=[1, 32],
                   help="batch sizes to run torch.compile (of the plain-torch-ops step) at; each costs ~20-60 s")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--no-pool", action="store_true", help="skip the GraphPool.run timings")
    p.add_argument("--engine-sizes", type=int, nargs="*", default=list(StepBenchConfig.engine_sizes),
                   help="batch sizes to time the whole engine's decode step at, synchronous and async")
    p.add_argument("--context-len", type=int, default=1024)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--out", type=Path, default=Path("results/step"))


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    cfg = StepBenchConfig(
        models=tuple(args.models),
        batch_sizes=tuple(args.batch_sizes),
        compile_sizes=() if args.no_compile else tuple(args.compile_sizes),
        context_len=args.context_len,
        device=args.device,
        dtype=args.dtype,
        attn_backend=args.attn_backend,
        warmup=args.warmup,
        reps=args.reps,
        use_pool=not args.no_pool,
        engine_sizes=tuple(args.engine_sizes),
    )
    run_step_bench(cfg, args.out, argv)
