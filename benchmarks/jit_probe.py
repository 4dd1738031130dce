"""Every Triton JIT compile of a run: when, how long, which kernel variant, from where.

    python benchmarks/jit_probe.py trace                # the trace bench of test_bench_gpu.py, compiles per phase
    python benchmarks/jit_probe.py serve -- SERVE_ARGS  # `graphpool bench serve SERVE_ARGS`, every process logged

A compile in the middle of serving stalls every stream for ~0.5 s. Both modes start from an empty Triton cache
(`--keep-cache`: the machine's own), so each variant a run needs is compiled, not loaded. `trace` runs the trace
bench in this process (an untimed eager warm-up, then the `no-graphs` and `no-warmup` policies at 8 req/s for
2 s) and lists the compiles made during the timed runs, each with the warm-up variant it differs least from
(the constexprs and argument attributes that differ: what Triton specialised on). `serve` puts a
`sitecustomize` on the bench's PYTHONPATH, so the prime server, the measured servers and the clients all log,
lists each process's compiles with wall-clock times, marks those inside a run's timed window (the bench's saved
runs hold it) and counts them. Needs CUDA.
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


def _name(key: Any, names: list[str]) -> str:
    """An argument's name from Triton's key for it (a 1-tuple of its index)."""
    return names[key[0]] if isinstance(key, tuple) and len(key) == 1 and key[0] < len(names) else str(key)


def record(kw: dict[str, Any], started: float, phase: str) -> dict[str, Any]:
    """One compile from the arguments Triton passes its JIT hooks (`knobs.runtime`)."""
    c = kw["compile"]
    names = list(kw["fn"].jit_function.arg_names)
    attrs = {_name(k, names): str(v) for k, v in c["configs"][0].items() if isinstance(k, tuple) and len(k) == 1}
    # NOTE: graphpool's own frames, the probe's left out: where in the package the launch came from
    frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack(limit=40)
              if f"{os.sep}graphpool{os.sep}" in f.filename]
    return {"pid": os.getpid(), "phase": phase, "t": started, "ms": round((time.time() - started) * 1e3, 1),
            "kernel": kw["fn"].name, "constexprs": {_name(k, names): str(v) for k, v in c["constants"].items()},
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


def bench_out(serve_args: list[str]) -> Path:
    """The --out of a bench serve run with these arguments, read by bench serve's own parser."""
    from graphpool.bench.serve.options import add_args

    p = argparse.ArgumentParser(add_help=False)
    add_args(p)
    return p.parse_known_args(serve_args)[0].out


def timed_windows(out: Path) -> list[tuple[str, float, float]]:
    """Each run's timed window (Unix s) from bench serve's saved runs under `out`/runs."""
    windows = []
    for path in sorted((out / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        if run.get("timed_from_unix") is not None and run.get("timed_to_unix") is not None:
            windows.append((path.stem, run["timed_from_unix"], run["timed_to_unix"]))
    return windows


def serve_mode(out: Path, serve_args: list[str]) -> int:
    site = Path(tempfile.mkdtemp(prefix="jit_probe"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = out / "compiles.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, LOG_ENV: str(log),
           "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    rc = subprocess.call([sys.executable, "-m", "graphpool.bench", "serve", *serve_args], env=env)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    windows = timed_windows(bench_out(serve_args))
    for r in rows:
        r["run"] = next((name for name, t0, t1 in windows if t0 <= r["t"] <= t1), None)
    first: dict[int, float] = {}
    for r in rows:
        first.setdefault(r["pid"], r["t"])
    for pid in sorted(first, key=first.get):
        mine = [r for r in rows if r["pid"] == pid]
        print(f"process {pid}: {len(mine)} compiles, {sum(r['ms'] for r in mine) / 1e3:.2f} s")
        for r in mine:
            where = f" IN TIMED RUN {r['run']}" if r["run"] else ""
            print(f"  {stamp(r['t'])} {r['ms']:7.1f} ms {r['kernel']}{where} {r['constexprs']} <- {r['from'][-1:]}")
    timed = [r for r in rows if r["run"]]
    print(f"{len(timed)} of {len(rows)} compiles fell in the {len(windows)} timed runs "
          f"({sum(r['ms'] for r in timed) / 1e3:.2f} s)")
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # NOTE: split by hand: argparse would take bench serve's own options (--out, --model) for the probe's
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="serve: graphpool bench serve's arguments follow a --")
    p.add_argument("mode", choices=["trace", "serve"])
    p.add_argument("--out", type=Path, default=Path("results/jit_probe"))
    p.add_argument("--keep-cache", action="store_true", help="Triton's own cache, not an empty one")
    args = p.parse_args(argv[:cut])
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
    return serve_mode(args.out, argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
