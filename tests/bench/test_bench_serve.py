"""`graphpool bench serve`: its pure parts, and one real run on the CPU (real server subprocess, real model)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphpool.bench.latency import RequestTimeline
from graphpool.bench.serve.client import ClientRun, RequestResult, text_prompt
from graphpool.bench.serve.clients import process_caps
from graphpool.bench.serve.configs import (
    CONFIG_NAMES,
    custom_config,
    full_pool_sizes,
    ladder_size,
    pick_config,
    serve_configs,
)
from graphpool.bench.serve.options import Load
from graphpool.bench.serve.report import evaluate_targets
from graphpool.bench.serve.run import ServeBenchConfig, config_from_args
from graphpool.bench.serve.runs import RunSummary, spread, summarize_run
from graphpool.bench.serve.server import parse_metrics
from graphpool.bench.workload import generate_trace
from graphpool.engine.args import add_engine_args, engine_config_from_args
from graphpool.engine.timeline import records_from_export

SRC = Path(__file__).resolve().parents[2] / "src"


def _bench_config(**kw: object) -> ServeBenchConfig:
    base = dict(model="smollm2-135m-instruct", dtype=None, loads=(Load(4.0),), duration_s=10.0, seeds=(0,),
                configs=("no-graphs",), budget="256MiB", prompt_mean=50.0, prompt_cap=128, output_mean=20.0,
                output_cap=64, sigma=1.0, url=None, server_args=(), startup_timeout_s=60.0, stop_timeout_s=10.0,
                resume=False)
    return ServeBenchConfig(**(base | kw))  # type: ignore[arg-type]


def test_arrival_schedule_is_seeded() -> None:
    cfg = _bench_config()
    a, b, c = (generate_trace(cfg.trace(s, cfg.loads[0])) for s in (0, 0, 1))
    assert a == b and a != c
    arrivals = [r.arrival_s for r in a]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals[-1] < cfg.duration_s
    assert all(1 <= r.prompt_len <= 128 and 1 <= r.output_len <= 64 for r in a)
    assert len({r.output_len for r in a}) > 3  # mixed output lengths
    assert text_prompt(a[0], 0) == text_prompt(a[0], 0) != text_prompt(a[0], 1)
    assert len(text_prompt(a[0], 0).split()) == a[0].prompt_len


def test_a_concurrency_cap_is_dealt_over_the_client_processes_without_growing() -> None:
    assert process_caps(1, 4) == [1]  # single stream: one process
    assert process_caps(6, 4) == [2, 2, 1, 1]
    assert process_caps(8, 4) == [2, 2, 2, 2]
    assert process_caps(None, 3) == [None, None, None]


def test_configs_and_ladder() -> None:
    assert ladder_size([]) == 46  # 1..32, then 48..240 by 16, then 256
    assert ladder_size(["--graph-max-batch-size=64"]) == 34
    cfgs = serve_configs(46, "128MiB")
    assert list(cfgs) == list(CONFIG_NAMES)
    assert cfgs["no-graphs"].flags == ("--disable-cudagraph",)
    assert cfgs["capture-all"].flags == ("--graph-warmup", "all", "--max-graph-pool-size", "46",
                                         "--graph-warmup-before-ready")
    lru = cfgs["lru16-capture-on-miss"].flags
    assert "--graph-miss-policy" in lru and "16" in lru and cfgs["default"].flags == ()
    assert cfgs["budget"].flags == ("--graph-memory-budget", "128MiB")
    assert cfgs["no-warmup"].flags == ("--graph-warmup", "none")
    assert cfgs["microbatch-overlap"].flags == ("--enable-microbatch-overlap",)
    assert cfgs["defer-captures"].flags == ("--graph-defer-captures",)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    parsed = parser.parse_args(list(cfgs["defer-captures"].flags))
    assert engine_config_from_args(parsed, device="cpu").pool_config.defer_captures
    assert ladder_size(["--enable-microbatch-overlap"]) == 30  # per microbatch: 1..16, then 24..128 by 8
    full = full_pool_sizes([])
    assert len(full) == len(set(full)) == 16 and full[0] == 256  # the whole default pool, the largest first
    assert full_pool_sizes(["--max-graph-pool-size=4"]) == full[:4]
    flags = serve_configs(46, "128MiB", full)["full-pool"].flags
    assert flags == ("--graph-warmup", ",".join(map(str, full)), "--graph-warmup-before-ready")
    with pytest.raises(ValueError, match="exactly one --configs"):
        _bench_config(url="http://127.0.0.1:1", configs=("no-graphs", "default"))
    with pytest.raises(ValueError, match="names of no-graphs, capture-all, "):
        _bench_config(configs=("z",))
    with pytest.raises(ValueError, match="rate"):
        _bench_config(loads=(Load(0.0),))
    args = SimpleNamespace(model="random:llama3.2-1b", dtype=None, rate=1.0, duration=5.0, seeds=2, first_seed=3,
                           configs=["lru16-capture-on-miss", "default"], budget="1GiB", prompt_mean=10.0, prompt_cap=20, max_tokens_mean=5.0,
                           max_tokens_cap=10, sigma=1.0, concurrency=None, url=None, server_arg=["--max-num-seqs=8"],
                           startup_timeout=10.0, stop_timeout=5.0, resume=False, prime=True,
                           step_timeline=False, client_processes=2, temperatures=[0.0, 0.8], top_p=0.9, vllm_python="python3",
                           vllm_model=None, vllm_pythonpath="/tmp/vllm-site", vllm_arg=[], loads=None,
                           gap_threshold_ms=2.0)
    cfg = config_from_args(args)  # type: ignore[arg-type]
    assert cfg.loads == (Load(1.0),) and cfg.load_tag(cfg.loads[0]) == "" and cfg.gap_threshold_ms == 2.0
    with pytest.raises(ValueError, match="--gap-threshold-ms"):
        config_from_args(SimpleNamespace(**{**vars(args), "gap_threshold_ms": 0.0}))  # type: ignore[arg-type]
    assert not cfg.step_timeline and cfg.client_processes == 2 and cfg.temperatures == (0.0, 0.8)
    assert cfg.top_p == 0.9
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="--top-p"):
            config_from_args(SimpleNamespace(**{**vars(args), "top_p": bad}))  # type: ignore[arg-type]
    assert cfg.seeds == (3, 4) and cfg.token_ids and cfg.engine_flags()[-1] == "--max-num-seqs=8"
    with pytest.raises(ValueError, match="--seeds"):
        config_from_args(SimpleNamespace(**{**vars(args), "seeds": 0}))  # type: ignore[arg-type]


def test_custom_configs_add_engine_flags_to_the_defaults() -> None:
    """NAME=FLAGS: an A/B of any engine flag in one run, refused before any server starts when it is not one."""
    custom = custom_config("p128=--mixed-prompt-tokens 128 --graph-warmup 1,2,4")
    assert custom.key == "p128" and custom.flags == ("--mixed-prompt-tokens", "128", "--graph-warmup", "1,2,4")
    assert not custom.foreign and "--mixed-prompt-tokens 128" in custom.label
    assert pick_config("default", serve_configs(46, "1GiB")).flags == ()
    assert pick_config("p64=--mixed-prompt-tokens=64", {}).flags == ("--mixed-prompt-tokens=64",)
    assert _bench_config(configs=("default", "p128=--mixed-prompt-tokens 128")).configs[1].startswith("p128=")
    for spec, reason in [("default=--seed 1", "names of"), ("P=--seed 1", "names of"), ("p128", "names of"),
                         ("x=--no-such-flag 1", "--no-such-flag"), ("x=", "needs engine flags"),
                         ("x=--seed one", "invalid int")]:
        with pytest.raises(ValueError, match=reason):
            custom_config(spec)
    with pytest.raises(ValueError, match="distinct"):
        _bench_config(configs=("x=--seed 1", "x=--seed 2"))


def test_loads_parse_name_runs_and_refuse_repeats() -> None:
    assert Load.parse("16") == Load(16.0) and Load.parse("2:1") == Load(2.0, 1)
    assert Load(16.0).tag == "16rps" and Load(2.0, 1).tag == "2rps-c1" and Load(0.5, 4).tag == "0.5rps-c4"
    for bad in ("x", "2:0", "2:y", ""):
        with pytest.raises(ValueError, match="load"):
            Load.parse(bad)
    cfg = _bench_config(loads=(Load(16.0), Load(2.0, 1)))
    assert [cfg.load_tag(x) for x in cfg.loads] == ["16rps", "2rps-c1"]
    assert [len(generate_trace(cfg.trace(0, x))) > 0 for x in cfg.loads] == [True, True]
    assert len(generate_trace(cfg.trace(0, cfg.loads[0]))) > len(generate_trace(cfg.trace(0, cfg.loads[1])))
    with pytest.raises(ValueError, match="distinct"):
        _bench_config(loads=(Load(2.0, 1), Load(2.0, 1)))
    with pytest.raises(ValueError, match="rate"):
        _bench_config(loads=(Load(16.0), Load(-1.0)))


def test_metrics_names_match_the_server() -> None:
    """Parses what the server's own ServerMetrics renders, so a renamed metric fails here."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from graphpool.pool import FallbackReason, PoolStats
    from graphpool.server.metrics import EngineSnapshot, ServerMetrics

    stats = SimpleNamespace(running=1, waiting=0, num_free_kv_blocks=5, num_kv_blocks=9, prompt_tokens_total=7,
                            generation_tokens_total=40, preemptions_total=2, prefix_cache_queries_tokens_total=9,
                            prefix_cache_hits_tokens_total=3, prefix_cache_blocks=1, async_chained_steps_total=0,
                            graph_warmup_pending=2)
    pool = PoolStats(steps=30, hits=20, padded_hits=3, misses=6, captures=5, evictions=1, eager_steps=4,
                     fallbacks={FallbackReason.LEN_TOO_LARGE: 3, FallbackReason.OVER_BUDGET: 1},
                     resident_graphs=4, resident_bytes=3 << 20, capture_seconds_total=1.5)
    def render(graph: object) -> str:
        metrics = ServerMetrics(log_interval_s=0)
        metrics.collector.snapshot = EngineSnapshot(stats=stats, graph=graph)
        return generate_latest(metrics.registry).decode()

    m = parse_metrics(render(pool))
    assert m == {"captures": 5, "capture_seconds": 1.5, "hits": 20, "padded_hits": 3, "misses": 6, "evictions": 1,
                 "eager_steps": 4, "capture_failures": 0, "steps": 30, "generation_tokens": 40, "preemptions": 2,
                 "prompt_tokens": 7, "resident": 4, "resident_bytes": 3 << 20, "arena_bytes": 0, "fallbacks": 4,
                 "warmup_pending": 2}
    no_graphs = parse_metrics(render(None))
    assert "captures" not in no_graphs and no_graphs["generation_tokens"] == 40


def test_the_workloads_wait_for_the_servers_deferred_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphpool.bench.serve import server

    pending = iter([3.0, 1.0, 0.0])
    scrapes: list[str] = []

    def fake_scrape(url: str) -> dict[str, float]:
        scrapes.append(url)
        return {"warmup_pending": next(pending)}

    monkeypatch.setattr(server, "scrape", fake_scrape)
    assert server.wait_warmup("http://x", timeout_s=60) >= 0 and len(scrapes) == 3
    monkeypatch.setattr(server, "scrape", lambda url: {})  # a server without the gauge: no wait
    assert server.wait_warmup("http://x", timeout_s=60) < 1
    monkeypatch.setattr(server, "scrape", lambda url: {"warmup_pending": 1.0})
    with pytest.raises(server.ServerFailed, match="still had warm-up graphs"):
        server.wait_warmup("http://x", timeout_s=0.1)


def _result(i: int, sent: float, times: list[float], tokens: int, asked: int, error: str | None = None) -> RequestResult:
    tl = RequestTimeline(sent, asked, token_times=times, finished=error is None)
    return RequestResult(i, sent, 4, asked, tl, end_s=times[-1] if times else sent, prompt_tokens=4,
                         completion_tokens=tokens, error=error)


def test_summarize_run_first_gap_is_each_requests_step_after_its_prefill() -> None:
    # the first gap of every request 5 ms, the others 1 ms
    ok = [_result(i, float(i), [i + 0.1, i + 0.105, *(i + 0.105 + 0.001 * k for k in range(1, 9))], 10, 10)
          for i in range(20)]
    client = ClientRun(results=ok, duration_s=21.0, max_in_flight=1, errors_sample=[])
    run, _ = summarize_run("default", "graphpool default", 0, "m", 1.0, 20.0, client, {}, {}, 1.0, (0.1, False))
    assert run.itl_first_ms["p50"] == pytest.approx(5.0) and run.itl_ms["p50"] == pytest.approx(1.0)
    assert math.isnan(run.timed_from_unix)  # no time 0 on the client's clock: no window


def test_a_runs_timed_window_is_on_the_wall_clock_from_its_time_0() -> None:
    client = ClientRun(results=[_result(0, 0.0, [0.1, 0.2], 2, 2)], duration_s=0.2, max_in_flight=1,
                       errors_sample=[], t0_monotonic=time.monotonic() - 12.0)
    run, _ = summarize_run("default", "d", 0, "m", 1.0, 10.0, client, {}, {}, 1.0, (0.1, False))
    assert run.timed_to_unix - run.timed_from_unix == pytest.approx(12.0, abs=0.5)
    assert abs(run.timed_to_unix - time.time()) < 5


def test_summarize_run_percentiles_and_deltas() -> None:
    ok = [_result(i, float(i), [i + 0.1 + 0.01 * k * (1 + i % 3) for k in range(20)], 20, 20) for i in range(30)]
    bad = _result(30, 30.0, [], 0, 20, error="APIConnectionError: refused")
    client = ClientRun(results=[*ok, bad], duration_s=31.0, max_in_flight=3, errors_sample=[bad.error or ""])
    before = {"captures": 4, "capture_seconds": 2.0, "hits": 0, "evictions": 1}
    after = {"captures": 10, "capture_seconds": 3.0, "hits": 50, "evictions": 1, "resident": 7,
             "resident_bytes": 7 << 20}
    run, itls = summarize_run("default", "graphpool default", 0, "m", 1.0, 30.0, client, before, after, 5.5, (0.2, False))
    assert run.requests == 31 and run.errors == 1 and run.itl_gaps == 30 * 19 == len(itls)
    for d in (run.ttft_ms, run.itl_ms, run.e2e_ms):
        assert d["p50"] <= d["p99"] <= d["p99.9"]
    assert run.itl_ms["p50"] == pytest.approx(20.0) and run.itl_max_ms == pytest.approx(30.0)
    assert run.ttft_ms["p50"] == pytest.approx(100.0)
    assert run.output_tok_s == pytest.approx(600 / 31.0)
    assert run.serving["captures"] == 6 and run.serving["hits"] == 50 and run.serving["evictions"] == 0
    assert run.startup_capture_s == 2.0 and run.startup_captures == 4 and run.resident_mib == pytest.approx(7.0)
    assert math.isnan(run.serving["misses"])  # a series the server did not report is no count of 0
    eager, _ = summarize_run("no-graphs", "no graphs", 0, "m", 1.0, 30.0, client, {"generation_tokens": 0},
                             {"generation_tokens": 600}, 5.5, (0.2, False))
    assert all(math.isnan(v) for v in eager.serving.values()) and eager.startup_capture_s == 0


def _run(config: str, seed: int, p999: float, startup_capture: float, captures: float, errors: int = 0) -> RunSummary:
    nan = math.nan
    return RunSummary(config=config, label=config, seed=seed, model="m", rate=1.0, trace_s=1.0, requests=10,
                      errors=errors, itl_gaps=100, output_tokens=100, output_tok_s=10.0,
                      ttft_ms={"p50": nan, "p99": nan, "p99.9": nan}, itl_ms={"p50": 1.0, "p99": 2.0, "p99.9": p999},
                      e2e_ms={"p50": nan, "p99": nan, "p99.9": nan}, itl_max_ms=p999, startup_s=1.0,
                      startup_capture_s=startup_capture, startup_captures=0, serving={"captures": captures},
                      resident_graphs=0, resident_mib=0, prompt_tokens_mean=4, max_in_flight=1, stop_s=0.1,
                      killed=False)


def test_spread_and_targets() -> None:
    d = [_run("default", s, p, 0.1, c) for s, p, c in ((0, 10.0, 2), (1, 30.0, 1), (2, 11.0, 3))]
    assert spread(d, "itl_ms.p99.9") == (11.0, 10.0, 30.0)
    assert spread(d, "serving.captures") == (2, 1, 3)
    b = [_run("capture-all", s, 10.5, 5.0, 0) for s in range(3)]
    c = [_run("lru16-capture-on-miss", s, 50.0, 0.0, 20) for s in range(3)]
    met = evaluate_targets({"capture-all": b, "lru16-capture-on-miss": c, "default": d})
    assert [t.met for t in met] == [True, True, True, True]
    assert "11.00 ms vs 10.50 ms" in met[1].detail
    slow_d = [_run("default", s, 12.0, 1.0, 5, errors=1 if s == 0 else 0) for s in range(3)]
    missed = evaluate_targets({"capture-all": b, "lru16-capture-on-miss": c, "default": slow_d})
    assert [t.met for t in missed] == [False, False, False, False]
    assert "1 errors in 9 runs" in missed[0].detail
    assert [t.met for t in evaluate_targets({"default": d})] == [True, None, None]


def test_report_from_saved_runs(tmp_path: Path) -> None:
    """Runs saved one by one (NaN included) are read back into one report: JSON, Markdown with the targets, PNG."""
    from graphpool.bench.common import collect_env
    from graphpool.bench.serve.report import write_serve_report
    from graphpool.bench.serve.runs import load_runs, save_run

    runs = [_run("capture-all", 0, 10.0, 5.0, 0), _run("default", 0, 10.5, 0.2, 1), _run("default", 1, 12.0, 0.3, 2)]
    for r in runs:
        save_run(tmp_path / "runs", r, [1.0 + 0.01 * i for i in range(200)] + [r.itl_ms["p99.9"]])
    back = load_runs(tmp_path / "runs")
    assert [(r.config, r.seed, r.itl_ms) for r in back] == [(r.config, r.seed, r.itl_ms) for r in runs]
    assert math.isnan(back[0].ttft_ms["p50"])  # JSON null read back as NaN
    _, body, targets = write_serve_report(tmp_path, collect_env([]), {"note": 1})
    assert "| (default) default | 2 | 0 |" in body and "11.2 [10.5-12]" in body
    assert body.index("| (capture-all)") < body.index("| (default)")  # in the configurations' order
    assert [t.met for t in targets] == [True, False, True, None]
    data = json.loads((tmp_path / "serve.json").read_text())
    assert data["results"]["aggregate_median_min_max"]["default"]["itl_ms.p99.9"] == [11.25, 10.5, 12.0]
    assert (tmp_path / "serve_itl_cdf.png").stat().st_size > 10_000 and (tmp_path / "serve.md").exists()
    save_run(tmp_path / "runs", RunSummary(**{**vars(runs[0]), "rate": 9.0, "config": "no-graphs"}), [1.0])
    with pytest.raises(ValueError, match="own --out"):
        load_runs(tmp_path / "runs")


def test_wait_healthy_fails_fast() -> None:
    """A server that exits, or whose /health answers 503 (its engine died), stops the wait at once."""
    import http.server
    import threading
    import time

    from graphpool.bench.serve.server import ServerFailed, _wait_healthy

    class Dead(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"status": "error"}')

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Dead)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        t0 = time.perf_counter()
        with pytest.raises(ServerFailed, match="503"):
            _wait_healthy(alive, f"http://127.0.0.1:{httpd.server_address[1]}", t0 + 600)
        assert time.perf_counter() - t0 < 300  # not the deadline
    finally:
        alive.kill()
        alive.wait()
        httpd.shutdown()
    exits = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exits.wait()
    with pytest.raises(ServerFailed, match="status 3"):
        _wait_healthy(exits, "http://127.0.0.1:9", time.perf_counter() + 60)


def test_real_run_on_cpu(tmp_path: Path) -> None:
    """A live server subprocess on the real default model, one configuration, a short low-rate trace."""
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from graphpool.model.gguf_loader import default_gguf_path

    default_gguf_path()  # the default model is installed (fails with the reason otherwise)
    cmd = [sys.executable, "-m", "graphpool.bench", "serve", "--configs", "no-graphs", "--seeds", "1", "--rate", "3",
           "--temperatures", "0", "0.8", "--top-p", "0.95", "--duration", "3", "--prompt-mean", "12", "--prompt-cap", "24", "--max-tokens-mean", "8",
           "--max-tokens-cap", "16", "--out", str(tmp_path), "--server-arg=--max-model-len=128",
           "--startup-timeout", "600", "--stop-timeout", "300", "--no-prime"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"\d+/\d+ requests done/sent of \d+, \d+ in flight, 0 errors, [\d.]+ s elapsed", proc.stderr)
    data = json.loads((tmp_path / "serve.json").read_text())
    run, sampled = data["results"]["runs"]
    assert (run["temperature"], sampled["temperature"]) == (0.0, 0.8)
    assert (run["top_p"], sampled["top_p"]) == (1.0, 0.95) and sampled["errors"] == 0  # greedy: no top_p sent
    # the second workload's steps are its own: the server's timeline also holds the first's
    export = json.loads((tmp_path / "timelines" / "no-graphs-t0.8p0.95-seed0.json").read_text())
    counted = sum(int(v["steps"]) for v in sampled["gap_causes"]["steps"].values())
    assert 0 < counted == sum(s.start >= export["client_t0_monotonic"] for s in records_from_export(export))
    assert counted < len(export["steps"])
    assert run["config"] == "no-graphs" and run["errors"] == 0 and run["requests"] > 0, run["errors_sample"]
    assert run["itl_gaps"] > 0 and run["output_tokens"] > run["requests"]
    assert 0 < run["startup_s"] < 600 and run["startup_capture_s"] == 0 and not run["killed"]  # stopped by SIGTERM
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert 0 < run[key]["p50"] <= run[key]["p99"] <= run[key]["p99.9"], run[key]
    assert run["prompt_tokens_mean"] > 0
    assert data["results"]["targets"][0] == {"name": "0 errors", "met": True, "detail": "0 errors in 2 runs"}
    md = (tmp_path / "serve.md").read_text()
    assert "| (no-graphs) no graphs | 1 | 0 |" in md and "met: 0 errors" in md
    assert (tmp_path / "serve_itl_cdf.png").stat().st_size > 10_000
    assert (tmp_path / "runs" / "no-graphs-seed0.itl.npy").exists()
    assert (tmp_path / "logs" / "no-graphs-seed0.log").exists()
    # the server kept a step timeline and the client's gaps were put next to it
    causes = run["gap_causes"]
    assert causes["threshold_ms"] == 10.0 and sum(causes["counts"].values()) == causes["gaps"]
    assert causes["steps"]["prefill step"]["steps"] > 0 and causes["steps"]["eager decode step"]["steps"] > 0
    assert causes["ttft_tail"]["ttfts"] > 0 and sum(causes["ttft_tail"]["counts"].values()) == causes["ttft_tail"]["ttfts"]
    assert "Where the slowest TTFTs waited" in md
    assert (tmp_path / "timelines" / "no-graphs-seed0.json").exists()
    assert run["client_cpu_share"] > 0 and run["client_loop_lag_ms"]["p50"] >= 0
    assert 0 <= run["ttft_client_stalled"] <= run["requests"] and "TTFT p99 without them" in md


def test_restarts_compare_first_starts_and_restarts_per_config() -> None:
    from dataclasses import replace

    from graphpool.bench.serve.compare import compare_markdown, restarts

    runs = [replace(_run(cfg, seed, 1.0, 0.0, 0), startup_s=s, temperature=t)
            for cfg, seed, s in (("default", 0, 12.0), ("default", 1, 6.0), ("default", 2, 5.0),
                                 ("vllm", 0, 100.0), ("vllm", 1, 60.0), ("vllm", 2, 70.0))
            for t in (0.0, 0.8)]
    assert restarts(runs) == {"default": (12.0, 6.0), "vllm": (100.0, 70.0)}
    text = compare_markdown(runs, None)
    assert "| default | 12 | 6 | 0.09x |" in text and "| vllm | 100 | 70 | - |" in text
    assert restarts([r for r in runs if r.seed == 0]) == {}  # one start each: no restart to show


def test_targets_against_vllm_per_workload_and_start_up() -> None:
    """The side by side judges each graphpool configuration's ratios to vLLM's: ITL p50 at most 0.5x single
    stream and 0.8x under load, ITL p99 at most 0.5x, start-up at most 0.1x vLLM's restart where it has one."""
    from dataclasses import replace

    from graphpool.bench.serve.compare import compare_markdown, section, vllm_targets

    def run(cfg: str, seed: int, p50: float, p99: float, start: float, load: str, conc: int | None) -> RunSummary:
        return replace(_run(cfg, seed, p99, 0.0, 0), itl_ms={"p50": p50, "p99": p99, "p99.9": p99}, startup_s=start,
                       temperature=0.8, load=load, concurrency=conc, rate=16.0 if conc is None else 2.0,
                       server="vllm" if cfg == "vllm" else "graphpool")

    runs = [run("default", 0, 0.9, 1.0, 4.0, "16rps", None), run("vllm", 0, 1.0, 4.0, 100.0, "16rps", None),
            run("default", 0, 0.6, 1.5, 4.0, "2rps-c1", 1), run("vllm", 0, 1.0, 2.0, 100.0, "2rps-c1", 1)]
    verdicts = {t.name: t.met for t in vllm_targets(runs)}
    assert verdicts == {
        "(default) 16 req/s, sampled, temperature 0.8: ITL p50 <= 0.8x vLLM's": False,  # 0.9x
        "(default) 16 req/s, sampled, temperature 0.8: ITL p99 <= 0.5x vLLM's": True,  # 0.25x
        "(default) single stream, 2 req/s, sampled, temperature 0.8: ITL p50 <= 0.5x vLLM's": False,  # 0.6x
        "(default) single stream, 2 req/s, sampled, temperature 0.8: ITL p99 <= 0.5x vLLM's": False,  # 0.75x
        "(default) start-up <= 0.1x vLLM's (first start)": True,  # 4 s against 100
    }
    # a restart of each server: vLLM's restarted start-up is the reference
    again = [replace(r, seed=1, startup_s=30.0 if r.config == "vllm" else 3.5) for r in runs]
    start = [t for t in vllm_targets(runs + again) if "start-up" in t.name]
    assert [(t.name, t.met) for t in start] == [("(default) start-up <= 0.1x vLLM's (restarted)", False)]
    assert start[0].detail.startswith("3.75 vs 30 s")  # the median of its starts (4 and 3.5) against the restart
    text = compare_markdown(runs, None)
    assert "Targets against vLLM" in text and "- MISSED: (default) 16 req/s" in text and "- met: (default) start-up" in text
    _, data = section(runs, Path("unused"), plot=False)
    assert len(data["side_by_side_targets"]) == 5
    # graphpool alone: nothing to judge against
    assert vllm_targets([r for r in runs if r.config == "default"]) == []


def test_each_client_process_warms_its_client_up_untimed() -> None:
    """One streamed request shaped as the trace's (a short prompt, one token) before time 0; its failure goes to
    the run's error sample."""
    import asyncio
    from types import SimpleNamespace

    from graphpool.bench.serve.client import _warm_up

    calls: list[dict] = []

    async def chunks():
        yield SimpleNamespace()

    async def create(**kw):
        calls.append(kw)
        if kw["model"] == "broken":
            raise ConnectionError("refused")
        return chunks()

    client = SimpleNamespace(completions=SimpleNamespace(create=create))
    assert asyncio.run(_warm_up(client, "m", list(range(20)), 0.8)) is None
    kw = calls[0]
    assert kw["prompt"] == list(range(8)) and kw["max_tokens"] == 1 and kw["stream"] and kw["temperature"] == 0.8
    assert kw["extra_body"] == {"ignore_eos": True} and kw["stream_options"] == {"include_usage": True}
    assert "top_p" not in kw  # 1: left out, as a client that does not set it
    assert asyncio.run(_warm_up(client, "m", list(range(20)), 0.8, 0.9)) is None
    assert calls[-1]["top_p"] == 0.9
    assert asyncio.run(_warm_up(client, "broken", "a b c", 0.0)) == "warm-up request: ConnectionError: refused"


def test_the_clients_start_up_heap_is_frozen_for_the_trace_only() -> None:
    """Collections during the trace walk only what it makes: the objects alive after the warm-up request are
    frozen from before time 0 to the end, then unfrozen (a test process's collector is left as it was)."""
    pytest.importorskip("openai")
    import asyncio
    import gc
    import threading
    from http.server import ThreadingHTTPServer

    from fake_vllm_server import make_handler

    from graphpool.bench.serve.client import run_trace
    from graphpool.bench.workload import TraceRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler("m", 64))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    frozen_at_start: list[int] = []

    def ready() -> float:
        frozen_at_start.append(gc.get_freeze_count())
        return time.monotonic()

    assert gc.get_freeze_count() == 0
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = asyncio.run(run_trace(url, "m", [TraceRequest(0, 0.0, 4, 3)], 0, True, 1, "t", progress_every_s=0,
                                    ready=ready))
    finally:
        server.shutdown()
    assert run.results[0].error is None and run.results[0].completion_tokens == 3
    assert frozen_at_start[0] > 1000  # openai's and httpx's objects, and the warm-up's
    assert gc.get_freeze_count() == 0
