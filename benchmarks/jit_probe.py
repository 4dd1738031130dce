"""Every Triton JIT compile of a run: when, how long, which kernel variant, from where.

    python benchmarks/jit_probe.py trace                # the trace bench of test_bench_gpu.py, compiles per phase
    python benchmarks/jit_probe.py serve -- SERVE_ARGS  # `graphpool bench serve SERVE_ARGS`, every process logged

A compile in the middle of serving stalls every stream for ~0.5 s. Both modes start from an empty Triton cache
(`--keep-cache`: the machine's own), so each variant a run needs is compiled, not loaded. `trace` runs the trace
bench in this process (an untimed eager warm-up, then the `no-graphs` and `no-warmup` policies at 8 req/s for
2 s) and lists the compiles made during the timed runs, each with the warm-up variant it differs least from
(the constexprs and argument attributes that differ: what Triton specialised on). `serve` puts a
`sitecustomize` on the bench's PYTHONPATH, so the prime server, the measured servers and the clients all log,
and lists each process's compiles with wall-clock times to set beside the bench's own log. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SITECUSTOMIZE = f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport jit_probe\njit_probe.install()\n"
LOG_ENV = "GRAPHPOOL_JIT_LOG"  # read once, at process start, by the sitecustomize


def record(kw: dict[str, Any], started: float, phase: str) -> dict[str, Any]:
    """One compile from the arguments Triton passes its JIT hooks (`knobs.runtime`)."""
    c = kw["compile"]
    names = list(kw["fn"].jit_function.arg_names)
    attrs = {names[k[0]]: str(v) for k, v in c["configs"][0].items() if isinstance(k, tuple) and len(k) == 1}
    frames = [f.strip().splitlines()[0] for f in traceback.format_stack(limit=40) if "graphpool" in f]
    return {"pid": os.getpid(), "phase": phase, "t": started, "ms": round((time.time() - started) * 1e3, 1),
            "kernel": kw["fn"].name, "constexprs": {str(k): str(v) for k, v in c["constants"].items()},
            "attrs": attrs, "from": frames[-4:]}


def install(path: str | None = None, phase: list[str] | None = None) -> list[dict[str, Any]]:
    """Hooks Triton's JIT: each compile is appended to the returned list and, with `path` (or $GRAPHPOOL_JIT_LOG),
    written there as a JSON line. `phase[0]` is stored with it."""
    from triton import knobs

    path = path or os.environ.get(LOG_ENV)
    log: list[dict[str, Any]] = []
    pending: dict[int, float] = {}

    def before(**kw: Any) -> bool:
        pending[id(kw["key"])] = time.time()
        return False  # NOTE: True would skip the compile

    def after(**kw: Any) -> None:
        log.append(record(kw, pending.pop(id(kw["key"]), time.time()), phase[0] if phase else ""))
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(log[-1]) + "\n")

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after
    return log


def differs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What two variants of one kernel specialised on differently: {name: (a's, b's)}."""
    out = {}
    for part in ("constexprs", "attrs"):
        for k in sorted(set(a[part]) | set(b[part])):
            if a[part].get(k) != b[part].get(k):
                out[f"{part}:{k}"] = (a[part].get(k), b[part].get(k))
    return out


def stamp(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def trace_mode(out: Path) -> None:
    import graphpool.bench.trace.run as trace_run
    from graphpool.bench.trace.config import TraceBenchConfig

    phase = ["start"]
    log = install(str(out / "compiles.jsonl"), phase)
    warm, one = trace_run.warm_process, trace_run.run_one

    def warm_phase(cfg: TraceBenchConfig) -> Any:
        phase[0] = "warm-up"
        try:
            return warm(cfg)
        finally:
            phase[0] = "between"

    def run_phase(cfg: TraceBenchConfig, sc: Any, rate: float, ladder: Any) -> Any:
        phase[0] = f"timed:{sc.key}"
        try:
            return one(cfg, sc, rate, ladder)
        finally:
            phase[0] = "between"

    trace_run.warm_process, trace_run.run_one = warm_phase, run_phase
    cfg = TraceBenchConfig(model="random:smollm2-135m", rates=(8.0,), duration_s=2.0,
                           configs=("no-graphs", "no-warmup"), kv_gib=0.25, max_model_len=512, prompt_mean=32,
                           prompt_cap=128, output_mean=32, output_cap=128)  # fmt: skip
    res = trace_run.run_trace_bench(cfg, out, ["jit_probe", "trace"])
    print("| phase | compiles | seconds compiling |\n|---|---|---|")
    for p in dict.fromkeys(r["phase"] for r in log):
        mine = [r for r in log if r["phase"] == p]
        print(f"| {p} | {len(mine)} | {sum(r['ms'] for r in mine) / 1e3:.2f} |")
    for r in res["runs"]:
        print(f"{r['config']}: {r['decode_steps']} decode steps, ITL max {r['latency'].itl_max_ms:.0f} ms")
    for r in log:
        if r["phase"].startswith("timed"):
            warmed = [w for w in log if w["phase"] == "warm-up" and w["kernel"] == r["kernel"]]
            near = min(warmed, key=lambda w: len(differs(r, w)), default=None)
            print(f"{r['phase']}: {r['kernel']} {r['ms']:.0f} ms, from {r['from'][-2:]}; against the nearest "
                  f"warm-up variant: {differs(r, near) if near else 'none warmed'}")


def serve_mode(out: Path, serve_args: list[str]) -> int:
    site = Path(tempfile.mkdtemp(prefix="jit_probe"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = out / "compiles.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, LOG_ENV: str(log),
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    rc = subprocess.call([sys.executable, "-m", "graphpool.bench", "serve", *serve_args], env=env)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    first = {}
    for r in rows:
        first.setdefault(r["pid"], r["t"])
    for pid in sorted(first, key=first.get):
        mine = [r for r in rows if r["pid"] == pid]
        print(f"process {pid}: {len(mine)} compiles, {sum(r['ms'] for r in mine) / 1e3:.2f} s")
        for r in mine:
            print(f"  {stamp(r['t'])} {r['ms']:7.1f} ms {r['kernel']} {r['constexprs']} <- {r['from'][-1:]}")
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["trace", "serve"])
    p.add_argument("serve_args", nargs="*", help="after --: graphpool bench serve's arguments")
    p.add_argument("--out", type=Path, default=Path("results/jit_probe"))
    p.add_argument("--keep-cache", action="store_true", help="Triton's own cache, not an empty one")
    args = p.parse_args()
    if not args.keep_cache:  # NOTE: before anything imports triton
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache")
    import torch

    if not torch.cuda.is_available():
        print("jit_probe needs CUDA: Triton compiles nothing on this machine", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "trace":
        trace_mode(args.out)
        return 0
    return serve_mode(args.out, args.serve_args)


if __name__ == "__main__":
    sys.exit(main())
