"""Process start to ready: `graphpool serve` started `--runs` times in turn, each timed from the spawn to the
first GET /health 200, with the start-up phases the server logs; the median last.

    python benchmarks/ready_probe.py [--runs 3] [--port 8123] [-- serve flags ...]

The first run may pay cold caches (the OS page cache for the weights, Triton's compile cache on a GPU); the
later ones are restarts.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

PHASES = re.compile(r"start-up ([0-9.]+) s: (.*)$")


def one_run(port: int, serve_args: list[str], timeout_s: float) -> tuple[float, str]:
    """(seconds from the spawn to /health 200, the server's start-up line)."""
    cmd = [sys.executable, "-m", "graphpool", "serve", "--port", str(port), *serve_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: flags for graphpool serve")
    args = p.parse_args()
    serve_args = [a for a in args.serve_args if a != "--"]
    print(f"command: graphpool serve --port {args.port} {' '.join(serve_args)}".rstrip(), flush=True)
    times = []
    for i in range(args.runs):
        ready, phases = one_run(args.port, serve_args, args.timeout)
        times.append(ready)
        print(f"run {i + 1}: ready {ready:.2f} s after the spawn; server: {phases}", flush=True)
    print(f"median ready: {statistics.median(times):.2f} s over {len(times)} runs "
          f"(first {times[0]:.2f} s, min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    main()
