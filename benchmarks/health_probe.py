"""Does a large request stall the server? `/health` is polled every 50 ms and one greedy stream decodes while
large requests arrive: a body over the request limit (refused with 413), a text prompt just under the limit
(refused as too long by its length in characters), one tokenized off the event loop and then refused as too
many tokens, and deeply nested JSON (400). Prints /health latency and
the stream's inter-token gaps per phase, and the server's RSS before and after.

    python benchmarks/health_probe.py [--model smollm2-135m-instruct] [--device cpu] [--big-mib 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from graphpool.bench.serve.server import start_server

MiB = 2**20


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Poller(threading.Thread):
    """GET /health every `period` s; (time sent, latency s, status) per poll."""

    def __init__(self, url: str, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.url, self.period, self.stop = url, period, threading.Event()
        self.samples: list[tuple[float, float, int]] = []

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                t = time.perf_counter()
                status = client.get(f"{self.url}/health").status_code
                self.samples.append((t, time.perf_counter() - t, status))
                time.sleep(self.period)


class Stream(threading.Thread):
    """One greedy streamed completion; the arrival time of every chunk."""

    def __init__(self, url: str, model: str, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.tokens = url, model, tokens
        self.arrivals: list[float] = []

    def run(self) -> None:
        body = {"model": self.model, "prompt": "Tell me a long story about a lighthouse.", "max_tokens": self.tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=600) as client, client.stream("POST", f"{self.url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    self.arrivals.append(time.perf_counter())


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    ms = sorted(v * 1e3 for v in values)
    return f"p50 {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms (n={len(ms)})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cpu")
    p.add_argument("--big-mib", type=float, default=10.0, help="size of the over-limit body")
    p.add_argument("--stream-tokens", type=int, default=400)
    args = p.parse_args()
    log = Path(tempfile.mkdtemp()) / "server.log"
    server = start_server(["--model", args.model, "--device", args.device], log, 600.0, dict(os.environ))
    assert server.proc is not None
    pid, url = server.proc.pid, server.url
    try:
        rss0 = rss_mib(pid)
        poller = Poller(url)
        poller.start()
        time.sleep(1.0)
        stream = Stream(url, args.model, args.stream_tokens)
        stream.start()
        time.sleep(2.0)
        phases: list[tuple[str, float, float, int]] = []
        with httpx.Client(timeout=600) as client:
            big = b'{"model": "m", "prompt": "' + b"a " * int(args.big_mib * MiB / 2) + b'"}'
            just_under = {"model": args.model, "prompt": "word " * int(3.9 * MiB / 5), "max_tokens": 1}
            # short enough to pass the character bound, so it is tokenized (off the event loop) before refusal
            tokenized = {"model": args.model, "prompt": "lighthouse keeper " * 3000, "max_tokens": 1}
            nested = b"[" * 100_000 + b"]" * 100_000
            for name, kwargs in (
                (f"{args.big_mib:g} MiB body", {"content": big, "headers": {"content-type": "application/json"}}),
                ("3.9 MiB text prompt", {"json": just_under}),
                ("54 kB prompt, tokenized, too long", {"json": tokenized}),
                ("nested JSON x100000", {"content": nested, "headers": {"content-type": "application/json"}}),
            ):
                t0 = time.perf_counter()
                status = client.post(f"{url}/v1/completions", **kwargs).status_code
                phases.append((name, t0, time.perf_counter(), status))
                time.sleep(1.0)
        stream.join()
        time.sleep(0.5)
        poller.stop.set()
        poller.join()
        rss1 = rss_mib(pid)
    finally:
        server.stop(30.0)
    base = [lat for t, lat, _ in poller.samples if t < phases[0][1]]
    gaps = [b - a for a, b in zip(stream.arrivals, stream.arrivals[1:], strict=False)]
    print(f"python benchmarks/health_probe.py --model {args.model} --device {args.device} --big-mib {args.big_mib:g}")
    print(f"server RSS {rss0:.0f} MiB before, {rss1:.0f} MiB after; /health polls all 200: "
          f"{all(s == 200 for _, _, s in poller.samples)}")
    print(f"/health before any large request: {summary(base)}")
    print(f"stream: {len(stream.arrivals)} chunks, gaps {summary(gaps)}")
    print("| request | status | answered in s | /health while it ran | stream gaps while it ran |")
    print("|---|---|---|---|---|")
    for name, t0, t1, status in phases:
        lats = [lat for t, lat, _ in poller.samples if t0 <= t <= t1]
        inside = [b - a for a, b in zip(stream.arrivals, stream.arrivals[1:], strict=False) if t0 <= b <= t1]
        print(f"| {name} | {status} | {t1 - t0:.2f} | {summary(lats)} | {summary(inside)} |")


if __name__ == "__main__":
    main()
