from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from graphpool.bench.cli import _add_benches, main
from graphpool.bench.plots import plot_itl_cdfs, plot_memory


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    _add_benches(p)
    return p.parse_args(argv)


def test_bench_subcommands_parse_with_defaults() -> None:
    a = _parse(["step"])
    assert a.models == ["llama3.2-1b", "llama3-8b"] and a.compile_sizes == [1, 32] and a.out == Path("results/step")
    assert a.batch_sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    m = _parse(["memory", "--budget-mib", "300"])
    assert m.budget_mib == 300.0 and m.evict_to == [32, 16, 8, 1, 0]
    t = _parse(["trace", "--quick", "--configs", "no-graphs", "capture-all", "no-warmup", "--out", "x"])
    assert t.quick and t.configs == ["no-graphs", "capture-all", "no-warmup"] and t.out == Path("x")
    with pytest.raises(SystemExit):
        _parse(["trace", "--configs", "abe"])  # names, not letters
    s = _parse(["serve"])
    assert s.configs == ["no-graphs", "capture-all", "lru16-capture-on-miss", "default", "budget"]


def test_trace_profiles_default_and_quick() -> None:
    from graphpool.bench.trace.config import CONFIG_NAMES
    from graphpool.bench.trace.run import config_from_args

    full = config_from_args(_parse(["trace"]))
    # the default profile fits ~4 min on the H200: 3 loads x 8 s x 7 configs of serving (+ ~1 s a run)
    assert full.rates == (4.0, 16.0, 40.0) and full.duration_s == 8.0 and full.configs == CONFIG_NAMES
    assert len(full.rates) * len(full.configs) * (full.duration_s + 1.0) <= 200
    quick = config_from_args(_parse(["trace", "--quick"]))
    assert quick.rates == (16.0, 40.0) and quick.duration_s == 5.0
    assert config_from_args(_parse(["trace", "--quick", "--duration", "3", "--rates", "8"])).rates == (8.0,)


def test_memory_bench_refuses_a_cpu_device_with_a_clear_error(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    assert main(["memory", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_plots_write_png_files(tmp_path: Path) -> None:
    p = plot_memory({"shared": [(46, 98.0), (16, 98.0), (0, 0.0)], "per_graph": [(46, 2000.0), (16, 450.0)]},
                    tmp_path / "m.png", "t", budget_point=(10, 240.0, 256.0))
    q = plot_itl_cdfs({"16 req/s": {"(a)": [10.0, 12.0, 50.0], "(b)": [2.0, 2.5, 3.0]}, "40 req/s": {"(a)": []}},
                      tmp_path / "c.png")
    assert p.stat().st_size > 1000 and q.stat().st_size > 1000
