"""Process start to ready: `graphpool serve` started `--runs` times in turn, each timed from the spawn to the
first GET /health 200, with the start-up phases the server logs; the median last.

    python benchmarks/ready_probe.py [--runs 3] [--port 8123] [--trees SRC ...] [-- serve flags ...]

The first run may pay cold caches (the OS page cache for the weights, Triton's compile cache on a GPU); the
later ones are restarts. `--trees` compares source trees (folders holding a `graphpool` package, e.g. `src`
and another commit's `src` from `git archive`): each round starts the server once from each, in turn, so a
noisy machine weighs on both alike, and the median of each is printed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

PHASES = re.compile(r"start-up ([0-9.]+) s: (.*)$")


def one_run(port: int, serve_args: list[str], timeout_s: float, tree: str | None = None) -> tuple[float, str]:
    """(seconds from the spawn to /health 200, the server's start-up line); `tree`: a source folder put first
    on the server's PYTHONPATH."""
    cmd = [sys.executable, "-m", "graphpool", "serve", "--port", str(port), *serve_args]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(tree), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {proc.stderr.read()[-2000:] if proc.stderr else ''}")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"no GET /health 200 within {timeout_s} s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.02)
        ready = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    found = next((m.group(0) for line in err.splitlines() if (m := PHASES.search(line))), "")
    return ready, found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="starts (with --trees: rounds, one start per tree each)")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--trees", nargs="+", default=[None], metavar="SRC",
                   help="source folders to start the server from in turn (default: the environment's graphpool)")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: flags for graphpool serve")
    args = p.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    print(f"command: graphpool serve --port {args.port} {' '.join(serve_args)}".rstrip(), flush=True)
    times: dict[str | None, list[float]] = {tree: [] for tree in args.trees}
    for i in range(args.runs):
        for tree in args.trees:
            ready, phases = one_run(args.port, serve_args, args.timeout, tree)
            times[tree].append(ready)
            label = f" ({tree})" if tree is not None else ""
            print(f"run {i + 1}{label}: ready {ready:.2f} s after the spawn; server: {phases}", flush=True)
    for tree, t in times.items():
        label = f"{tree}: " if tree is not None else ""
        print(f"{label}median ready: {statistics.median(t):.2f} s over {len(t)} runs "
              f"(first {t[0]:.2f} s, min {min(t):.2f}, max {max(t):.2f})")


if __name__ == "__main__":
    main()
