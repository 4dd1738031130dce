"""Shared pieces of the benchmarks: environment record, timing, HBM bandwidth, report writing.

Every benchmark prints and saves the same header (command, GPU, torch, CUDA, date) so numbers from
different runs can be told apart; results go to `<out>/<bench>.json` and `<out>/<bench>.md`.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import math
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("graphpool.bench")

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class EnvInfo:
    command: str
    gpu: str
    torch_version: str
    cuda_version: str
    python_version: str
    date: str

    def header_markdown(self) -> str:
        return (
            f"- command: `{self.command}`\n- GPU: {self.gpu}\n- torch {self.torch_version}, "
            f"CUDA {self.cuda_version}, Python {self.python_version}\n- date: {self.date}\n"
        )


def collect_env(argv: Sequence[str] | None = None, device: torch.device | None = None) -> EnvInfo:
    args = list(sys.argv if argv is None else argv)
    if device is not None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"none (CPU: {platform.processor() or platform.machine()})"
    return EnvInfo(
        command=shlex.join(args),
        gpu=gpu,
        torch_version=torch.__version__,
        cuda_version=str(torch.version.cuda),
        python_version=platform.python_version(),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def device_and_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """`--device` and `--dtype` read as the engine reads them (EngineConfig): a CUDA device with its index,
    `auto` dtype bfloat16 on CUDA and float32 on the CPU."""
    from graphpool.engine.config import EngineConfig

    config = EngineConfig(device=device, dtype=dtype, int4_weights=False)  # NOTE: benches load float weights
    return config.torch_device, config.torch_dtype


# ---------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for an empty sample."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan


# ---------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, reps: int) -> list[float]:
    """Per-call times in ms: CUDA events around each call on the GPU, a host clock on the CPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    if device.type != "cuda":
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def capture_graph(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any, float]:
    """`fn` captured in a CUDA graph after one warm-up call on a side stream (lazy init and autotuning stay
    out of the capture) -> (graph, fn's output inside it, capture seconds)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out, time.perf_counter() - t0


def measure_hbm_bandwidth(device: torch.device, nbytes: int = 2 * GIB, reps: int = 20) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written."""
    # NOTE: random data like real weights and KV, not zeros; the element type does not matter, only the bytes.
    src = torch.randn(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = time_ms(lambda: dst.copy_(src), device, warmup=3, reps=reps)
    return 2 * src.numel() * src.element_size() / (median(times) * 1e-3)


# ---------------------------------------------------------------- device memory (driver view)


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def driver_used_bytes(device: torch.device) -> int:
    """Device memory in use as the driver sees it (all processes), after freeing cached blocks."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total - free


# ---------------------------------------------------------------- reports


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _jsonable(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, int | float | str | bool) or obj is None:
        return obj
    return str(obj)


def write_report(
    out_dir: Path, bench: str, env: EnvInfo, results: Any, markdown_body: str, title: str
) -> tuple[Path, Path]:
    """Writes `<out_dir>/<bench>.json` (env + results) and `<out_dir>/<bench>.md`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{bench}.json"
    md_path = out_dir / f"{bench}.md"
    json_path.write_text(json.dumps({"env": _jsonable(env), "results": _jsonable(results)}, indent=2) + "\n")
    md_path.write_text(f"# {title}\n\n{env.header_markdown()}\n{markdown_body}")
    return json_path, md_path


def progress(msg: str) -> None:
    """One progress line on stderr, flushed (a log cut short still shows where the bench got to)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
