"""The engine flags every command shares (graphpool.engine.args), the pool's one-line summary and why graphs are
off."""

from __future__ import annotations

import argparse
import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.engine.config import EngineConfig
from graphpool.pool import FallbackReason, PoolStats

FLAGS = ["--device", "cpu", "--max-graph-pool-size", "4", "--graph-memory-budget", "1GiB", "--num-kv-blocks", "32"]


def test_generate_serve_and_bench_serve_read_the_same_engine_flags() -> None:
    from graphpool.cli import build_parser
    from graphpool.server.main import build_parser as server_parser

    own = argparse.ArgumentParser()
    add_engine_args(own)
    configs = [
        engine_config_from_args(own.parse_args(FLAGS)),
        engine_config_from_args(build_parser().parse_args(["generate", "--prompt", "x", *FLAGS])),
        engine_config_from_args(build_parser().parse_args(["serve", *FLAGS])),
        engine_config_from_args(server_parser().parse_args(FLAGS)),
    ]
    assert all(c == configs[0] for c in configs)
    assert configs[0].max_graph_pool_size == 4 and configs[0].graph_memory_budget == 1 << 30
    assert configs[0].num_kv_blocks == 32 and configs[0].max_num_seqs == 256  # an unset flag keeps the default
    assert engine_config_from_args(own.parse_args(FLAGS), num_kv_blocks=8).num_kv_blocks == 8  # overrides win


STATS = PoolStats(steps=120, hits=90, padded_hits=20, misses=10, captures=6, evictions=2, eager_steps=4,
                  resident_graphs=4, resident_bytes=3 * (1 << 20) + (1 << 19), capture_seconds_total=0.456)


def test_describe_gives_every_counter_and_the_bounds_when_given() -> None:
    line = ("120 decode steps: 90 hits, 20 padded hits, 10 misses, 6 captures (0.46 s), 2 evictions, 4 eager; "
            "4{} graphs resident (3.5 MiB{})")
    assert STATS.describe() == line.format("", "")
    assert STATS.describe(16, 512 << 20) == line.format("/16", " of 512 MiB budget")
    assert STATS.describe(16) == line.format("/16", "")


def test_generate_summary_line_is_the_pool_description_on_a_gpu() -> None:
    from graphpool.cli import describe_graphs

    config = SimpleNamespace(max_graph_pool_size=16, graph_memory_budget=None)
    engine = SimpleNamespace(config=config, graphs_off=None, graph_stats=lambda: STATS)
    assert describe_graphs(engine) == f"graph pool: {STATS.describe(16)}"  # type: ignore[arg-type]
    engine.graphs_off, engine.graph_stats = FallbackReason.DISABLED, lambda: None
    assert "off (--disable-cudagraph)" in describe_graphs(engine)  # type: ignore[arg-type]
    engine.graphs_off = FallbackReason.NO_CUDA
    assert "need a CUDA GPU" in describe_graphs(engine)  # type: ignore[arg-type]


def test_disable_kernels_is_an_engine_flag_checked_once(capsys: pytest.CaptureFixture[str]) -> None:
    """`--disable-kernels` reaches EngineConfig.disabled_kernels (in the switches' order) from every command,
    is listed in --help, refused when it names no switch, and said on the `generate` command's loading line."""
    from graphpool.cli import build_parser, main
    from graphpool.server.main import build_parser as server_parser

    flags = ["--device", "cpu", "--disable-kernels", "step_argmax,gemv"]
    for args in (build_parser().parse_args(["generate", "--prompt", "x", *flags]),
                 build_parser().parse_args(["serve", *flags]), server_parser().parse_args(flags)):
        assert engine_config_from_args(args).disabled_kernels == ("gemv", "step_argmax")
    assert EngineConfig(device="cpu").disabled_kernels == ()
    assert EngineConfig(device="cpu", disabled_kernels=["pdl", "pdl"]).disabled_kernels == ("pdl",)
    with pytest.raises(ValueError, match=r"unknown kernel switch.*'argmax'"):
        EngineConfig(device="cpu", disabled_kernels="argmax")
    help_text = " ".join(server_parser().format_help().split())
    assert "--disable-kernels" in help_text and "gemv, pdl, gemv_rope, gemv_swiglu, gemv_norm, gemv_rows, step_argmax, step_sample, attn_stages" in help_text
    assert main(["generate", "--prompt", "x", "--disable-kernels", "gemm", "--device", "cpu"]) == 2
    assert "unknown kernel switch" in capsys.readouterr().err
    # NOTE: an unknown model fails after the loading line, before any weight is read
    assert main(["generate", "--prompt", "x", "--device", "cpu", "--disable-kernels", "pdl,gemv",
                 "--model", "no-such-model"]) == 2
    assert "; kernels off: gemv, pdl" in capsys.readouterr().err


def test_graphs_off_is_answered_once_for_the_config_and_the_pool() -> None:
    """No CUDA wins over --disable-cudagraph; a capturer (the tests' stand-in for CUDA graphs) turns them on."""
    from graphpool.engine.config import EngineConfig
    from graphpool.pool import graphs_off

    assert EngineConfig(device="cpu").graphs_off is FallbackReason.NO_CUDA
    assert EngineConfig(device="cpu", disable_cudagraph=True).graphs_off is FallbackReason.NO_CUDA
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert graphs_off(True, cuda, has_capturer=False) is None
    assert graphs_off(False, cuda, has_capturer=False) is FallbackReason.DISABLED
    assert graphs_off(True, cpu, has_capturer=True) is None
    assert graphs_off(False, cpu, has_capturer=True) is FallbackReason.DISABLED


def test_engine_flag_help_states_the_config_defaults() -> None:
    # the parsers import no torch, so the help carries figures: they must be EngineConfig's own defaults
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    words = {"on": True, "off": False}
    checked = 0
    for action in parser._actions:
        if not action.help or defaults.get(action.dest) is None:
            continue
        m = re.search(r"\((?:default:? )?(-?\d+(?:\.\d+)?|on|off)[);,]", action.help)
        if m:
            stated = words.get(m.group(1), m.group(1))
            assert str(stated) == str(defaults[action.dest]), (action.option_strings, stated, defaults[action.dest])
            checked += 1
    assert checked >= 10


def test_generate_chat_template_kwargs_need_chat_and_a_template_that_reads_them(capsys) -> None:
    from graphpool.cli import main

    assert main(["generate", "--prompt", "x", "--chat-template-kwargs", '{"enable_thinking": false}']) == 2
    assert "--chat-template-kwargs needs --chat" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--chat", "--chat-template-kwargs", "[1]"])
    assert "JSON object" in capsys.readouterr().err
    # the default model's template reads no variables: refused once it has loaded, before generating
    assert main(["generate", "--prompt", "x", "--chat", "--device", "cpu", "--max-tokens", "1", "--no-progress",
                 "--chat-template-kwargs", '{"enable_thinking": false}']) == 2
    assert "does not read 'enable_thinking'" in capsys.readouterr().err
