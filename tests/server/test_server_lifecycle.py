"""The server's lifecycle in-process, on a fake engine whose steps take as long as a test needs: the bounded
drain (streams end with finish_reason "abort" and [DONE], new requests get a 503), /metrics that does not
wait for a step, the engine thread's CUDA device, the port check and the ready time.

The same shutdown against a real `python -m graphpool.server` process and signals: test_server_shutdown.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import torch

from char_tokenizer import CharTokenizer
from graphpool.engine.outputs import EngineStats, RequestOutput
from graphpool.engine.sampling_params import SamplingParams
from graphpool.server.async_engine import AsyncEngine, ShuttingDownError
from graphpool.server.lifecycle import PortInUseError, bind_socket, seconds_since_process_start
from graphpool.server.main import serve_in_thread


@dataclass
class SlowEngine:
    """Each step waits for ``hold`` (when set to an Event), sleeps ``step_s`` and gives every request the letter
    'x'; finishes at max_tokens."""

    step_s: float = 0.01
    hold: threading.Event | None = None
    model_name: str = "slow"
    max_model_len: int = 1_000_000
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    requests: dict[str, tuple[list[int], SamplingParams, list[int]]] = field(default_factory=dict)
    generated: int = 0
    in_step: threading.Event = field(default_factory=threading.Event)
    last_step: Any = None

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        self.requests[request_id] = (self.encode(prompt), params, [])

    def encode(self, prompt: str | list[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def abort_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        self.in_step.set()
        if self.hold is not None:
            self.hold.wait()
        time.sleep(self.step_s)
        self.in_step.clear()
        outs = []
        for rid, (ids, params, gen) in list(self.requests.items()):
            gen.append(ord("x"))
            self.generated += 1
            done = len(gen) >= params.max_tokens
            outs.append(
                RequestOutput(
                    rid, ids, list(gen), [gen[-1]], "x" * len(gen), "x", done, "length" if done else None
                )
            )
            if done:
                del self.requests[rid]
        return outs

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 10, 10, 0, self.generated, 0)

    def graph_stats(self) -> None:
        return None


DRAIN_S = 3.0


@pytest.fixture
def slow_server() -> Iterator[tuple[str, Any, SlowEngine]]:
    engine = SlowEngine()
    with serve_in_thread(engine, shutdown_timeout=DRAIN_S) as (url, server):
        yield url, server, engine


def _stream(url: str, body: dict[str, Any], out: list[Any], first: threading.Event) -> None:
    with httpx.stream("POST", f"{url}/v1/{'chat/' if 'messages' in body else ''}completions",
                      json={**body, "stream": True}, timeout=60) as r:  # fmt: skip
        for line in r.iter_lines():
            if line:
                out.append(line)
                first.set()


def test_drain_ends_every_stream_with_abort_and_refuses_new_requests(slow_server: Any) -> None:
    url, server, engine = slow_server
    bodies = [{"prompt": f"p{i}", "max_tokens": 100_000} for i in range(3)]
    bodies += [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000}]
    lines: list[list[str]] = [[] for _ in bodies]
    started = [threading.Event() for _ in bodies]
    threads = [
        threading.Thread(target=_stream, args=(url, b, out, ev))
        for b, out, ev in zip(bodies, lines, started, strict=True)
    ]
    for t in threads:
        t.start()
    assert all(ev.wait(30) for ev in started)
    # a short request finishes normally during the drain
    short: list[str] = []
    short_started = threading.Event()
    short_thread = threading.Thread(
        target=_stream, args=(url, {"prompt": "s", "max_tokens": 20}, short, short_started)
    )
    short_thread.start()
    assert short_started.wait(30)

    with httpx.Client(base_url=url, timeout=10) as client:
        start = time.monotonic()
        server.begin_shutdown()
        assert server.engine.draining  # refusing once begin_shutdown returns, before the loop runs the drain
        health = client.get("/health")
        refused = client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
    assert health.status_code == 503 and health.json() == {"status": "shutting_down"}
    assert refused.status_code == 503
    assert "shutting down" in refused.json()["error"]["message"]
    for t in [*threads, short_thread]:
        t.join(30)
        assert not t.is_alive()
    # the timeout, then a step and the writes (generous for a busy machine: without the timeout the streams'
    # 100,000 steps take over 1,000 s)
    assert DRAIN_S <= time.monotonic() - start < DRAIN_S + 60.0

    for body, out in zip(bodies, lines, strict=True):
        assert out[-1] == "data: [DONE]"
        chunks = [json.loads(ln.removeprefix("data: ")) for ln in out[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort", body
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    short_chunks = [json.loads(ln.removeprefix("data: ")) for ln in short[:-1]]
    assert short[-1] == "data: [DONE]" and short_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not engine.requests  # aborted in the engine: KV blocks freed


def test_drain_gives_a_non_streamed_request_its_text_so_far(slow_server: Any) -> None:
    url, server, engine = slow_server
    result: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: result.append(
            httpx.post(f"{url}/v1/completions", json={"prompt": "p", "max_tokens": 100_000}, timeout=60)
        )
    )
    thread.start()
    deadline = time.monotonic() + 30
    while engine.generated < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.begin_shutdown()
    thread.join(30)
    body = result[0].json()
    assert result[0].status_code == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert choice["text"] == "x" * body["usage"]["completion_tokens"] and len(choice["text"]) >= 5


def test_drain_with_nothing_running_returns_at_once() -> None:
    engine = SlowEngine()
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        import asyncio

        start = time.monotonic()
        assert asyncio.run(async_engine.drain(300.0)) == 0
        assert time.monotonic() - start < 60.0  # not the drain's timeout

        async def add() -> None:
            await async_engine.add_request("r", "x", SamplingParams(max_tokens=2))

        with pytest.raises(ShuttingDownError, match="shutting down"):
            asyncio.run(add())
    finally:
        async_engine.shutdown()


def test_metrics_do_not_wait_for_a_slow_step(slow_server: Any) -> None:
    url, _, engine = slow_server
    engine.hold = threading.Event()  # the step runs until the test lets it go
    thread = threading.Thread(
        target=httpx.post, args=(f"{url}/v1/completions",), kwargs={"json": {"prompt": "p", "max_tokens": 3},
                                                                   "timeout": 300},
    )  # fmt: skip
    thread.start()
    assert engine.in_step.wait(60)
    for _ in range(3):
        r = httpx.get(f"{url}/metrics", timeout=60)  # a /metrics that waited for the step would time out here
        assert r.status_code == 200 and "graphpool_requests_running 1.0" in r.text
        assert engine.in_step.is_set()  # answered while the step still runs
    engine.hold.set()
    thread.join(60)
    assert not thread.is_alive()


def test_engine_thread_sets_an_indexed_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cuda` has no index (torch.cuda.set_device raises on it): the thread uses the current device's."""
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(d))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for device, expected in ((torch.device("cuda"), 3), (torch.device("cuda:1"), 1)):
        async_engine = AsyncEngine(SlowEngine(device=device))
        async_engine.start()
        async_engine.shutdown()
        assert async_engine.error is None
        assert calls[-1] == expected and isinstance(calls[-1], int)


def test_bind_socket_reports_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=rf"127\.0\.0\.1:{port}.*--port"):
            bind_socket("127.0.0.1", port)
    sock = bind_socket("127.0.0.1", port)  # free again
    sock.close()


def test_seconds_since_process_start_counts_from_the_process_start() -> None:
    """Measured in a child that sleeps before importing the module: the age includes the sleep."""
    code = (
        "import time; time.sleep(1.5)\n"
        "from graphpool.server.lifecycle import seconds_since_process_start\n"
        "print(seconds_since_process_start())"
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    wall = time.monotonic() - start
    age = float(out.stdout.strip())
    assert 1.5 <= age <= wall + 0.05
    assert seconds_since_process_start() > 0


def test_a_negative_shutdown_timeout_is_refused_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    from graphpool.server.main import main

    assert main(["--device", "cpu", "--shutdown-timeout", "-1"]) == 2
    assert "--shutdown-timeout must be >= 0" in capsys.readouterr().err


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_startup_heap_collects_then_freezes_what_start_up_built() -> None:
    import gc
    import weakref

    from graphpool.server.lifecycle import startup_heap

    assert gc.isenabled() and gc.get_freeze_count() == 0
    try:
        with startup_heap():
            assert not gc.isenabled()
            garbage = weakref.ref(_Cycle())  # unreachable at once, freed only by a collection
            kept = [_Cycle() for _ in range(1000)]
        assert gc.isenabled()
        assert garbage() is None, "the start-up's cyclic garbage is collected before the freeze"
        assert gc.get_freeze_count() >= len(kept), "what start-up built is frozen"
    finally:
        gc.unfreeze()


def test_startup_heap_freezes_nothing_when_the_engine_fails() -> None:
    import gc

    from graphpool.server.lifecycle import startup_heap

    with pytest.raises(ValueError, match="refused"), startup_heap():
        raise ValueError("refused")
    assert gc.isenabled() and gc.get_freeze_count() == 0
