"""Device memory of the three mempool layouts, in the driver's view.

    python benchmarks/memory_probe.py [--graphs 35] [--keep 16] [--hidden 2048] [--vocab 32000]

For each layout: capture N graphs (largest first), then evict the least recently used down to K, then all.
Reports resident bytes (driver delta and the pool's accounting) and bytes given back at each eviction.
"""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import asdict, dataclass

import torch

from graphpool.pool.config import PoolConfig
from graphpool.pool.pool import GraphPool
from toy import TOY_SPECS, ToyDecode

MiB = 2**20


@dataclass(frozen=True)
class LayoutMemory:
    layout: str
    graphs: int
    keep: int
    resident_driver: int  # device bytes held by N graphs (driver free-memory delta)
    resident_accounted: int  # sum of per-graph footprints measured at capture
    evicted_accounted: int  # accounted bytes of the N-K graphs evicted
    freed_driver: int  # device bytes given back by evicting N-K graphs
    freed_all_driver: int  # device bytes given back by then evicting the remaining K
    capture_seconds_total: float


def _free(device: torch.device) -> int:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def probe_layout(
    layout: str, step: ToyDecode, graphs: int = 35, keep: int = 16, device: torch.device | str = "cuda"
) -> LayoutMemory:
    device = torch.device(device)
    cfg = PoolConfig(mempool=layout, max_graph_pool_size=graphs, miss_policy="capture")  # type: ignore[arg-type]
    pool = GraphPool(step, TOY_SPECS, cfg, device=device)
    sizes = sorted(pool.ladder.sizes, reverse=True)[:graphs]
    base = _free(device)
    pool.warmup(sizes)
    st = pool.stats()
    held = _free(device)
    evict = pool.resident_sizes()[: max(0, len(sizes) - keep)]
    before = pool.stats().resident_bytes
    for s in evict:
        pool.evict(s)
    after_evict = _free(device)
    evicted_accounted = before - pool.stats().resident_bytes
    pool.evict_all()
    after_all = _free(device)
    pool.close()
    return LayoutMemory(
        layout=layout,
        graphs=st.resident_graphs,
        keep=keep,
        resident_driver=base - held,
        resident_accounted=st.resident_bytes,
        evicted_accounted=evicted_accounted,
        freed_driver=after_evict - held,
        freed_all_driver=after_all - after_evict,
        capture_seconds_total=st.capture_seconds_total,
    )


def probe(
    graphs: int = 35, keep: int = 16, hidden: int = 2048, vocab: int = 32000, layers: int = 2
) -> list[LayoutMemory]:
    step = ToyDecode(vocab=vocab, hidden=hidden, layers=layers, dtype=torch.bfloat16, device="cuda")
    return [probe_layout(layout, step, graphs, keep) for layout in ("arena", "per_graph", "shared")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=35)
    ap.add_argument("--keep", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON object per layout instead of a table")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("memory_probe needs a CUDA device")
    rows = probe(args.graphs, args.keep, args.hidden, args.vocab, args.layers)
    if args.json:
        for r in rows:
            print(json.dumps(asdict(r)))
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"toy step: hidden {args.hidden}, vocab {args.vocab}, {args.layers} layers, bf16")
    print("layout     graphs  resident MiB (driver/accounted)  evict to K: freed MiB (of accounted)  evict all: freed MiB")
    for r in rows:
        print(
            f"{r.layout:<10} {r.graphs:>6}  {r.resident_driver / MiB:>10.1f} / {r.resident_accounted / MiB:<10.1f}"
            f"        K={r.keep}: {r.freed_driver / MiB:>8.1f} ({r.evicted_accounted / MiB:.1f})"
            f"        {r.freed_all_driver / MiB:>8.1f}"
        )


if __name__ == "__main__":
    main()
