"""`python -m graphpool.server --tensor-parallel-size 2` on the CPU: the server process is rank 0 and starts
rank 1 itself; it serves, and SIGTERM stops both processes."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
from test_server_shutdown import server_factory  # noqa: F401 (a fixture)

MODEL = "random:qwen2.5-0.5b?layers=2"


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_tensor_parallel_server_serves_and_stops_its_ranks(server_factory: Any) -> None:  # noqa: F811
    server = server_factory("--model", MODEL, "--tensor-parallel-size", "2", "--max-model-len", "128",
                            "--num-kv-blocks", "64")
    assert "tensor parallel over 2 ranks (this process is rank 0)" in server.text()
    ranks = _children(server.proc.pid)
    assert len(ranks) >= 1  # rank 1 (and multiprocessing's resource tracker, if it started one)
    body = {"model": MODEL, "prompt": [100, 101, 102, 103, 104], "max_tokens": 5, "temperature": 0}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    assert reply["usage"]["completion_tokens"] == 5 and reply["choices"][0]["finish_reason"] == "length"
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(300) == 0
    deadline = time.monotonic() + 120  # generous: a busy machine tears torch down slowly
    while (alive := [pid for pid in ranks if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"rank processes {alive} outlived the server"


def _running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an exited child its new parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
