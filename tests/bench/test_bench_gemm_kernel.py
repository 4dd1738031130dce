"""`python -m graphpool.bench.gemm_kernel`'s files (its timings need a GPU: tests/gpu runs none of them): the
JSON, Markdown and plot from a run's rows, the modes' op sets (one chain on the CPU), and the refusal without
CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphpool.bench import gemm_kernel
from graphpool.bench.common import collect_env
from graphpool.kernels.switches import check_switches
from graphpool.model.ops import kernel_ops


def _rows() -> list[dict[str, object]]:
    modes = {"cublas": 815.9, "gemv": 729.8, "gemv+pdl": 652.2}
    return [
        dict(zip(gemm_kernel.HEADERS, ("llama3.2-1b", mode, 1856, 457.8, t, round(t / 457.8, 2),
                                       round(815.9 / t, 2)), strict=True))
        for mode, t in modes.items()
    ]  # fmt: skip


def test_write_outputs_writes_json_markdown_and_a_plot(tmp_path: Path) -> None:
    paths = gemm_kernel.write_outputs(_rows(), tmp_path, collect_env(["gemm_kernel"]), "H200 bf16")
    assert sorted(p.name for p in paths) == ["gemm_kernel.json", "gemm_kernel.md", "gemm_kernel.png"]
    data = json.loads((tmp_path / "gemm_kernel.json").read_text())
    assert [r["mode"] for r in data["results"]] == ["cublas", "gemv", "gemv+pdl"]
    assert data["env"]["command"] == "gemm_kernel"
    md = (tmp_path / "gemm_kernel.md").read_text()
    assert "| llama3.2-1b | gemv+pdl | 1856 | 458 | 652 | 1.42 | 1.25 |" in md and "H200 bf16" in md
    assert (tmp_path / "gemm_kernel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_needs_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        gemm_kernel.main(["--models", "llama3.2-1b"])


def test_modes_are_op_sets_of_the_kernel_switches() -> None:
    """Each mode names switches off; on the CPU (the kernels' torch references) every mode's chain is the same."""
    assert all(check_switches(off) == off for off in gemm_kernel.MODES.values())
    gen = torch.Generator().manual_seed(0)
    hidden, qkv, inter = 16, 24, 32
    layers = [{"norm": torch.rand(hidden, generator=gen) + 0.5, "qkv": torch.randn(qkv, hidden, generator=gen),
               "o": torch.randn(hidden, hidden, generator=gen), "gate_up": torch.randn(2 * inter, hidden, generator=gen),
               "down": torch.randn(hidden, inter, generator=gen)} for _ in range(2)]  # fmt: skip
    x = torch.randn(1, hidden, generator=gen)
    outs = [gemm_kernel.step(layers, x, kernel_ops(off)) for off in gemm_kernel.MODES.values()]
    assert outs[0].shape == (1, hidden) and all(torch.equal(o, outs[0]) for o in outs)
