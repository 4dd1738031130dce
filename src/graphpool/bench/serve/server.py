"""The server under test for `bench serve`: a `python -m graphpool.server` subprocess (or a foreign one, e.g.
vLLM), its health and /metrics."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from graphpool.bench.common import progress
from graphpool.bench.serve.client import top_p_field

# NOTE: counters as the exposition names them (prometheus_client adds `_total` to a counter's samples)
POOL_COUNTERS = {
    "captures": "graphpool_graph_captures_total",
    "capture_seconds": "graphpool_graph_capture_seconds_total",
    "hits": "graphpool_graph_hits_total",
    "padded_hits": "graphpool_graph_padded_hits_total",
    "misses": "graphpool_graph_misses_total",
    "evictions": "graphpool_graph_evictions_total",
    "eager_steps": "graphpool_graph_eager_steps_total",
    "capture_failures": "graphpool_graph_capture_failures_total",
    "steps": "graphpool_graph_steps_total",
    "generation_tokens": "graphpool_generation_tokens_total",
    "prompt_tokens": "graphpool_prompt_tokens_total",
    "preemptions": "graphpool_preemptions_total",
}
POOL_GAUGES = {"resident": "graphpool_graph_resident", "resident_bytes": "graphpool_graph_resident_bytes",
               "arena_bytes": "graphpool_graph_arena_bytes", "warmup_pending": "graphpool_graph_warmup_pending"}
# NOTE: vLLM's counters under the same keys, summed over their labels (model, engine, finish reason)
VLLM_COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "requests_finished": "vllm:request_success_total",
}
STARTUP_GAUGE = "graphpool_startup_seconds"  # {phase}: the server's start-up breakdown, where it has one
PHASE_PREFIX = "startup_phase:"  # parse_metrics's keys for that gauge's phases


def parse_metrics(text: str) -> dict[str, float]:
    """The pool's and engine's counters and gauges from a /metrics body (names as in POOL_COUNTERS /
    POOL_GAUGES; `fallbacks` and `requests_finished` sum graphpool's over their reasons), vLLM's (VLLM_COUNTERS),
    and the start-up phases as `startup_phase:<phase>`. Absent ones are left out (no pool when graphs are off)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    sums: dict[str, float] = {}
    phases: dict[str, float] = {}
    summed = {"graphpool_graph_fallbacks_total": "fallbacks", "graphpool_requests_finished_total": "requests_finished",
              **{name: key for key, name in VLLM_COUNTERS.items()}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in summed:
                sums[summed[s.name]] = sums.get(summed[s.name], 0.0) + s.value
            elif s.name == STARTUP_GAUGE:
                phases[f"{PHASE_PREFIX}{s.labels.get('phase', '')}"] = s.value
            else:
                samples[s.name] = s.value
    out = {key: samples[name] for key, name in (POOL_COUNTERS | POOL_GAUGES).items() if name in samples}
    return out | sums | phases


def scrape(url: str, timeout_s: float = 30.0, engine_series: bool = True) -> dict[str, float]:
    """The counters from /metrics; ``engine_series``: once graphpool's engine series are there (a graphpool
    server may publish its first snapshot only after its engine loop has started). A foreign server is read
    once, whatever it publishes ({} without a /metrics)."""
    import httpx

    deadline = time.perf_counter() + timeout_s
    while True:
        r = httpx.get(f"{url}/metrics", timeout=timeout_s)
        if not engine_series and r.status_code == 404:
            return {}
        r.raise_for_status()
        metrics = parse_metrics(r.text)
        if not engine_series or "generation_tokens" in metrics:
            return metrics
        if time.perf_counter() > deadline:
            raise ServerFailed(f"{url}/metrics has no graphpool engine series after {timeout_s:.0f} s")
        time.sleep(0.1)


def wait_warmup(url: str, timeout_s: float) -> float:
    """Seconds until the server has no deferred warm-up graph left to capture (0 at once from a server that
    captured them before ready, or that has no such gauge)."""
    t0 = time.perf_counter()
    while scrape(url).get("warmup_pending", 0) > 0:
        if time.perf_counter() - t0 > timeout_s:
            raise ServerFailed(f"{url} still had warm-up graphs to capture after {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A live server: its URL, the time from process start to GET /health 200, and its log file."""

    url: str
    startup_s: float
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None  # None: an existing server (--url), never stopped here

    def stop(self, timeout_s: float) -> tuple[float, bool]:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns (seconds to exit, whether it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0, False
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
            return time.perf_counter() - t0, False
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return time.perf_counter() - t0, True


class ServerFailed(RuntimeError):
    """The server under test did not come up (its log's tail is in the message)."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the benchmark process dies, so that a benchmark killed from
    outside (a timeout) leaves no server holding the GPU (Linux prctl; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def start_server(server_args: Sequence[str], log_path: Path, timeout_s: float, env: Mapping[str, str],
                 host: str = "127.0.0.1") -> ServerProcess:
    """Starts `python -m graphpool.server` on a free port and waits for GET /health to answer 200; ``env``:
    the child's whole environment (foreign.graphpool_env keeps vLLM's site dir out of it)."""
    port = free_port(host)
    cmd = [sys.executable, "-m", "graphpool.server", "--host", host, "--port", str(port), *server_args]
    return launch(cmd, f"http://{host}:{port}", log_path, timeout_s, env, foreign=False)


def launch(cmd: Sequence[str], url: str, log_path: Path, timeout_s: float, env: Mapping[str, str],
           foreign: bool) -> ServerProcess:
    """Starts ``cmd`` (a server that will listen at ``url``) with its output in ``log_path`` and waits until it
    is ready (``foreign``: GET /health or GET /v1/models 200; graphpool: GET /health 200)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        log.write(f"$ PYTHONPATH={env.get('PYTHONPATH', '')} {shlex.join(cmd)}\n".encode())
        log.flush()
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env), preexec_fn=_die_with_parent)
    server = ServerProcess(url=url, startup_s=float("nan"), log_path=log_path, proc=proc)
    try:
        server.startup_s = _wait_healthy(proc, url, t0 + timeout_s, foreign) - t0
    except ServerFailed as exc:
        server.stop(10.0)
        raise ServerFailed(f"{exc} ({timeout_s:.0f} s allowed); last lines of {log_path}:\n{log_tail(log_path)}"
                           ) from None
    except BaseException:  # interrupted: the server must not outlive the benchmark
        server.stop(10.0)
        raise
    return server


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, deadline: float, foreign: bool = False) -> float:
    """The perf_counter time the server was first ready; raises (with the log) if the server exits, answers
    503 (its engine died) or is not ready by ``deadline``. A foreign server without /health is ready when
    GET /v1/models answers 200."""
    import httpx

    with httpx.Client(timeout=5.0) as client:
        while True:
            if proc.poll() is not None:
                raise ServerFailed(f"the server exited with status {proc.returncode} before it was healthy")
            try:
                r = client.get(f"{url}/health")
                if r.status_code == 200:
                    return time.perf_counter()
                if r.status_code == 503 or not foreign:
                    raise ServerFailed(f"GET /health answered {r.status_code}: {r.text[:300]}")
                if client.get(f"{url}/v1/models").status_code == 200:
                    return time.perf_counter()
            except httpx.TransportError:
                pass  # not listening yet
            if time.perf_counter() > deadline:
                raise ServerFailed("the server was not healthy within the start-up timeout")
            time.sleep(0.1)


def connect(url: str, timeout_s: float = 10.0, foreign: bool = False) -> ServerProcess:
    """An existing server (start-up time unknown: NaN)."""
    import httpx

    url = url.rstrip("/").removesuffix("/v1")
    r = httpx.get(f"{url}/health", timeout=timeout_s)
    if r.status_code != 200 and foreign and r.status_code != 503:
        r = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    if r.status_code != 200:
        raise ValueError(f"{url} is not ready: {r.request.url.path} answered {r.status_code}: {r.text[:200]}")
    return ServerProcess(url=url, startup_s=float("nan"), log_path=Path(os.devnull))


def warm_up(url: str, model: str, prompt: str | list[int], temperature: float, timeout_s: float = 300.0,
            top_p: float = 1.0) -> float:
    """One untimed completion at ``temperature`` (and ``top_p`` where it cuts); returns its seconds. A server's
    first sampled request may compile its sampler (vLLM 0.26 without FlashInfer: a Triton JIT), which no timed
    request should pay."""
    import httpx

    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", timeout=timeout_s, json={
        "model": model, "prompt": prompt, "max_tokens": 8, "temperature": temperature, "ignore_eos": True,
        **top_p_field(top_p)})
    if r.status_code != 200:
        raise ServerFailed(f"the warm-up completion answered {r.status_code}: {r.text[:300]}")
    return time.perf_counter() - t0


def fetch_timeline(url: str) -> dict[str, object] | None:
    """The server's step timeline (GET /debug/steps), or None from a server that keeps none (a --url server
    started without --record-step-timeline: the run is reported without the attribution)."""
    import httpx

    r = httpx.get(f"{url}/debug/steps", timeout=120)
    if r.status_code == 404:
        progress(f"{url} keeps no step timeline (start it with --record-step-timeline): no gap attribution")
        return None
    r.raise_for_status()
    return dict(r.json())
