"""`python -m graphpool.server` as a process on the default model (CPU): SIGTERM with 8 streams in flight
exits within --shutdown-timeout plus a margin and every stream ends with a finish reason; a second signal
exits at once; a port in use is reported before the model loads; the ready line gives the start-up time.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

MODEL = "smollm2-135m-instruct"
SHUTDOWN_TIMEOUT_S = 3.0
# NOTE: after the drain's deadline come the step in flight, the last writes, the engine thread's stop and the
# interpreter's exit; generous for a busy machine (the streams' finish_reason "abort" shows the drain was cut).
EXIT_MARGIN_S = 120.0
STARTUP_S = 600.0  # the model's load on a busy machine


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    wall_to_healthy_s: float

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, *flags: str) -> Server:
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "graphpool.server", "--device", "cpu", "--port", str(port), *flags]
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() - start < STARTUP_S:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Server(proc, url, log, time.monotonic() - start)
        except httpx.HTTPError:
            pass  # not listening yet: poll again
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server was not healthy within {STARTUP_S:g} s:\n{log.read_text()}")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Server] = []

    def start(*flags: str) -> Server:
        started.append(_start(tmp_path, *flags))
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait(30)


@dataclass
class StreamResult:
    chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None


def _open_streams(url: str, n: int, max_tokens: int) -> tuple[list[StreamResult], list[threading.Thread]]:
    """n long openai-client streams in threads; returns once each has received a chunk."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    results = [StreamResult() for _ in range(n)]
    first = [threading.Event() for _ in range(n)]

    def run(i: int) -> None:
        r = results[i]
        try:
            stream = client.completions.create(
                model=MODEL, prompt=f"Story {i}:", max_tokens=max_tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            for chunk in stream:
                r.chunks += 1
                r.finish_reason = chunk.choices[0].finish_reason or r.finish_reason
                first[i].set()
        except openai.OpenAIError as e:
            r.error = repr(e)
        finally:
            first[i].set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    assert all(ev.wait(300) for ev in first)
    assert not any(r.error for r in results), results
    return results, threads


def test_sigterm_with_8_streams_exits_within_the_timeout_and_ends_every_stream(server_factory: Any) -> None:
    server = server_factory("--max-model-len", "2048", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S))
    m = re.search(r"serving \S+ on http://\S+ \(ready ([0-9.]+) s after process start\)", server.text())
    assert m is not None, server.text()
    assert 0 < float(m.group(1)) <= server.wall_to_healthy_s + 0.5

    results, threads = _open_streams(server.url, 8, max_tokens=1000)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rc = server.proc.wait(SHUTDOWN_TIMEOUT_S + EXIT_MARGIN_S)
    took = time.monotonic() - start
    for t in threads:
        t.join(60)
    assert rc == 0, server.text()
    assert took >= SHUTDOWN_TIMEOUT_S - 0.5  # it did drain: 1000 tokens each cannot finish in 3 s on a CPU
    # every client saw a clean end: a final chunk with a finish reason, then the stream closed
    assert all(not t.is_alive() for t in threads)
    assert [r.error for r in results] == [None] * 8
    assert [r.finish_reason for r in results] == ["abort"] * 8, results
    assert "8 requests aborted" in server.text()


def test_a_second_signal_exits_at_once(server_factory: Any) -> None:
    server = server_factory("--max-model-len", "2048", "--shutdown-timeout", "600")
    _open_streams(server.url, 2, max_tokens=1000)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert server.proc.poll() is None  # draining: up to 600 s
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 503
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rc = server.proc.wait(EXIT_MARGIN_S)
    assert time.monotonic() - start < 300.0  # not the drain's 600 s
    assert rc == 128 + signal.SIGTERM
    assert "second SIGTERM: exiting now" in server.text()


def test_a_port_in_use_is_reported_before_the_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "graphpool.server", "--device", "cpu", "--port", str(port)],
            capture_output=True, text=True, timeout=STARTUP_S,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    assert "loaded in" not in out.stderr + out.stdout  # refused before loading the model
