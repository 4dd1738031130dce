"""`graphpool --help` and the help of each command print without importing torch or numpy (each run in a fresh
interpreter, so nothing an earlier test imported counts)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# prints the help to a buffer, then the help and the heavy modules that got imported, as JSON
_PROBE = """
import contextlib, io, json, sys
from graphpool.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        assert exc.code == 0, exc.code
print(json.dumps({"help": buf.getvalue(), "heavy": [m for m in ("torch", "numpy") if m in sys.modules]}))
"""


def _help(*argv: str) -> tuple[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["help"], result["heavy"]


@pytest.mark.parametrize(("argv", "listed"), [
    (["--help"], ["generate", "serve", "bench"]),
    (["generate", "--help"], ["--prompt", "--model", "--cpu-threads", "--max-graph-pool-size"]),
    (["serve", "--help"], ["--port", "--model", "--cpu-threads", "--max-request-bytes"]),
    (["bench", "--help"], ["step", "memory", "trace", "serve", "profile", "tp-step", "kernels"]),
])
def test_help_lists_the_commands_without_importing_torch(argv: list[str], listed: list[str]) -> None:
    text, heavy = _help(*argv)
    assert heavy == []
    for word in listed:
        assert word in text


def test_a_bench_loads_its_own_flags_when_chosen() -> None:
    text, _ = _help("bench", "memory", "--help")
    assert "--sweep-steps" in text and "--evict-to" in text
