"""Where the LM head runs: inside the decode graph (the whole step captured) or after the replay (the pool
captures the model up to its final norm; `decode_head` runs on the live rows), side by side in one run.

    python benchmarks/head_placement.py [--models llama3.2-1b llama3-8b] [--rounds 5] [--reps 30]

For each model (random weights, bf16, context 1024, the default ladder up to bs 256, arena layout): both pools
capture the same 16 sizes (the start-up cover, then the fill), largest first; the table gives each arena
(the caching allocator's bytes of the shared MemPool) and the driver-view growth of the capture, then the
step's median time (CUDA events, the two placements' rounds interleaved) at bs 1/8/64/128, and whether the
two give the same logits and argmaxes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from graphpool.bench import common
from graphpool.bench.decode import DecodeSetup, build_random_model, setup_input_specs
from graphpool.bench.memory import capture_order
from graphpool.pool import GraphPool, PoolConfig, cuda_state

MIB = 1 << 20
SIZES = (1, 8, 64, 128)


def _pools(setup: DecodeSetup) -> tuple[dict[str, GraphPool], dict[str, float]]:
    device = setup.model.device
    steps = {"in graph": setup.full_step_fn(), "after replay": setup.engine_step_fn()}
    pools: dict[str, GraphPool] = {}
    held: dict[str, float] = {}
    for name, step in steps.items():
        base = common.driver_used_bytes(device)
        config = PoolConfig(miss_policy="capture", max_len_in_batch=setup.context_len, mempool="arena")
        pool = GraphPool(step, setup_input_specs(setup), config, device)
        groups = capture_order(pool.config, 16)
        pool.warmup(groups[0] + groups[1])
        held[name] = (common.driver_used_bytes(device) - base) / MIB
        pools[name] = pool
    return pools, held


def run_model(model: str, rounds: int, reps: int, device: torch.device) -> list[dict[str, object]]:
    m = build_random_model(model, device, torch.bfloat16, "auto", max_positions=1024 + 16)
    setup = DecodeSetup.create(m, 256, 1024)
    cuda_state.side_stream(device)
    with torch.inference_mode():
        for bs in (1, 256):  # the eager kernels' modules load before the baselines
            setup.full_step_fn()(setup.batch(bs))
        pools, held = _pools(setup)
        runs: dict[str, Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]] = {
            "in graph": lambda b: pools["in graph"].run(b),
            "after replay": lambda b: setup.head(pools["after replay"].run(b)),
        }
        rows = []
        for bs in SIZES:
            batch = setup.batch(bs)
            a = tuple(t.clone() for t in runs["in graph"](batch))
            b = tuple(t.clone() for t in runs["after replay"](batch))
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(rounds):
                for name, fn in runs.items():
                    times[name] += common.time_ms(lambda f=fn, b=batch: f(b), device, 3, reps)
            med = {k: common.median(v) for k, v in times.items()}
            rows.append({"model": model, "bs": bs, "in_graph_ms": med["in graph"], "after_ms": med["after replay"],
                         "ratio": med["after replay"] / med["in graph"], "logits_equal": torch.equal(a[0], b[0]),
                         "argmax_equal": torch.equal(a[1], b[1]),
                         "max_abs_diff": (a[0].float() - b[0].float()).abs().max().item()})
        for name, pool in pools.items():
            rows.append({"model": model, "placement": name, "arena_mib": pool.stats().arena_bytes / MIB,
                         "held_mib": held[name], "graphs": pool.stats().resident_graphs})
            pool.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama3.2-1b", "llama3-8b"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    device = torch.device("cuda")
    env = common.collect_env(None, device)
    print(env.header_markdown(), flush=True)
    print("| model | placement | graphs | arena MiB | driver-view MiB (16 graphs) |\n|---|---|---|---|---|")
    steps = []
    for model in args.models:
        rows = run_model(model, args.rounds, args.reps, device)
        for r in rows:
            if "placement" in r:
                print(f"| {model} | {r['placement']} | {r['graphs']} | {r['arena_mib']:.1f} | {r['held_mib']:.1f} |")
            else:
                steps.append(r)
        common.free_device_memory(device)
    print("\n| model | bs | head in graph ms | head after replay ms | ratio | logits equal | argmax equal |")
    print("|---|---|---|---|---|---|---|")
    for r in steps:
        print(f"| {r['model']} | {r['bs']} | {r['in_graph_ms']:.3f} | {r['after_ms']:.3f} | {r['ratio']:.3f} | "
              f"{r['logits_equal']} (max diff {r['max_abs_diff']:.3g}) | {r['argmax_equal']} |")


if __name__ == "__main__":
    main()
