"""`bench serve` against a foreign server (vLLM): its log, its metrics, the children's environments, and one
run end to end against a stand-in vLLM that publishes no graphpool_* series."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphpool.bench.serve.configs import serve_configs
from graphpool.bench.serve.foreign import VllmLaunch, graphpool_env, parse_vllm_log, vllm_command, vllm_env
from graphpool.bench.serve.server import parse_metrics

SRC = Path(__file__).resolve().parents[2] / "src"
FAKE = Path(__file__).resolve().parent / "fake_vllm_server.py"

# NOTE: lines as vLLM 0.26 logs them (prefixes, timestamps and tqdm's \r redraws included)
VLLM_LOG = "\n".join([
    "INFO 05-02 10:00:00 [api_server.py:1880] vLLM API server version 0.26.0",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:01 [core.py:77] Initializing a V1 LLM engine (v0.26.0) with config: "
    "model='/tmp/vllm-models/llama3.2-1b', compilation_config={'level': 3, 'cudagraph_capture_sizes': "
    "[512, 256, 128, 64, 32, 16, 8, 4, 2, 1], 'max_cudagraph_capture_size': 512}",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:09 [gpu_model_runner.py:2370] Model loading took 2.3185 GiB and "
    "5.31 seconds",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:31 [monitor.py:34] torch.compile takes 21.40 s in total",
    "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  50%|#####     | 5/10 [00:00<00:00, 9.1it/s]"
    "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 10/10 [00:01<00:00, 9.9it/s]",
    "\rCapturing CUDA graphs (decode, FULL): 100%|██████████| 10/10 [00:00<00:00, 30.2it/s]",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, "
    "took 0.45 GiB",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:41 [core.py:210] init engine (profile, create kv cache, warmup model) "
    "took 38.62 seconds",
    "INFO:     Application startup complete.",
])


def test_parse_vllm_log() -> None:
    info = parse_vllm_log(VLLM_LOG)
    assert info.graphs == 20 and info.capture_sizes == 10  # both bars' totals: piecewise + full
    assert info.graph_gib == pytest.approx(0.45)
    assert info.phases == {"model load": 5.31, "torch.compile": 21.40, "graph capture": 8.0, "engine init": 38.62}
    # a bar cut short is no graph count; without bars the capture sizes stand in
    partial = VLLM_LOG.replace("\rCapturing CUDA graphs (decode, FULL): 100%|██████████| 10/10", "")
    assert parse_vllm_log(partial).graphs == 10
    no_bars = "\n".join(line for line in VLLM_LOG.splitlines() if "Capturing CUDA" not in line)
    assert parse_vllm_log(no_bars).graphs == 10
    eager = parse_vllm_log("INFO Model loading took 2.3 GiB and 1.5 seconds\n")
    assert math.isnan(eager.graphs) and math.isnan(eager.graph_gib) and eager.phases == {"model load": 1.5}


def test_parse_vllm_and_startup_metrics() -> None:
    text = (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 120.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 30.0\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 2.0\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0\n'
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0\n'
        "# TYPE graphpool_startup_seconds gauge\n"
        'graphpool_startup_seconds{phase="model load"} 3.5\n'
        'graphpool_startup_seconds{phase="graph warm-up"} 1.25\n'
    )
    assert parse_metrics(text) == {"generation_tokens": 150.0, "preemptions": 2.0, "requests_finished": 8.0,
                                   "startup_phase:model load": 3.5, "startup_phase:graph warm-up": 1.25}


def test_children_environments(tmp_path: Path) -> None:
    """graphpool's server never sees vLLM's site dir; vLLM sees only its own PYTHONPATH."""
    site = tmp_path / "vllm-site"
    (site / "sub").mkdir(parents=True)
    parent = {"PYTHONPATH": os.pathsep.join([str(site), "/gp/site", str(site / "sub"), "/gp/src"]),
              "VLLM_USE_FLASHINFER_SAMPLER": "0", "HOME": "/h"}
    gp = graphpool_env(parent, f"{site}/")
    assert gp["PYTHONPATH"] == os.pathsep.join(["/gp/site", "/gp/src"]) and gp["HOME"] == "/h"
    assert "PYTHONPATH" not in graphpool_env({"PYTHONPATH": str(site)}, str(site))
    vl = vllm_env(parent, str(site))
    assert vl["PYTHONPATH"] == str(site) and vl["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert parent["PYTHONPATH"].startswith(str(site))  # the parent's own environment is left as it was


def test_vllm_command_matches_graphpool_settings() -> None:
    launch = VllmLaunch(python="/opt/py", args=("--gpu-memory-utilization=0.5",))
    vllm = serve_configs(46, "1GiB")
    assert vllm["vllm"].foreign and vllm["vllm-eager"].flags == ("--enforce-eager",) and not vllm["default"].foreign
    cmd = vllm_command(launch, "random:llama3.2-1b", None, ["--max-model-len=4096", "--max-num-seqs", "64"],
                       vllm["vllm-eager"].flags, "127.0.0.1", 8101)
    assert cmd[:5] == ["/opt/py", "-m", "vllm.entrypoints.cli.main", "serve", "/tmp/vllm-models/llama3.2-1b"]
    flags = " ".join(cmd[5:])
    for want in ("--port 8101", "--served-model-name random:llama3.2-1b", "--max-model-len 4096",
                 "--max-num-seqs 64", "--seed 0", "--dtype bfloat16", "--load-format dummy", "--enforce-eager"):
        assert want in flags
    assert cmd[-1] == "--gpu-memory-utilization=0.5"
    gguf = vllm_command(VllmLaunch(model_dir="/m/real"), "x.gguf", "float16", [], (), "h", 1)
    assert gguf[4] == "/m/real" and "--load-format" not in gguf and "--dtype float16" in " ".join(gguf)
    with pytest.raises(ValueError, match="--vllm-model"):
        VllmLaunch().resolved_model_dir("smollm2-135m-instruct")


def test_foreign_server_end_to_end(tmp_path: Path) -> None:
    """A stand-in vLLM (no graphpool_* series on /metrics) is measured under two loads, greedy and sampled, all
    four workloads against one start: ready on /health, start-up reported, graphs and graph memory read from its
    log, vllm:* counters read, run with only its own PYTHONPATH."""
    pytest.importorskip("openai")
    site = tmp_path / "vsite"
    cli = site / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for d in (site / "vllm", site / "vllm" / "entrypoints", cli):
        (d / "__init__.py").write_text("")
    shutil.copy(FAKE, cli / "main.py")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "graphpool.bench", "serve", "--configs", "vllm", "--model", "random:smollm2-135m",
           "--vllm-python", sys.executable, "--vllm-pythonpath", str(site), "--vllm-model", str(tmp_path / "model"),
           "--vllm-arg=--gpu-memory-utilization=0.5", "--server-arg=--max-model-len=256", "--temperatures", "0",
           "0.8", "--seeds", "1", "--loads", "4", "3:1", "--duration", "1.5", "--prompt-mean", "6", "--prompt-cap", "12",
           "--max-tokens-mean", "5", "--max-tokens-cap", "10", "--startup-timeout", "300", "--out", str(out)]
    # NOTE: the parent has vLLM's site on its PYTHONPATH too (install.sh env): the children still get theirs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(site)])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prime" not in proc.stderr  # nothing of graphpool's to prime
    log = (out / "logs" / "vllm-seed0.log").read_text()
    assert f"fake vllm PYTHONPATH={site}\n" in log
    assert "--max-model-len 256" in log and "--gpu-memory-utilization=0.5" in log and "--load-format dummy" in log
    data = json.loads((out / "serve.json").read_text())["results"]
    runs = {(r["load"], r["temperature"]): r for r in data["runs"]}
    assert set(runs) == {(load, t) for load in ("4rps", "3rps-c1") for t in (0.0, 0.8)}
    for r in runs.values():
        assert r["config"] == "vllm" and r["server"] == "vllm" and r["errors"] == 0 and r["requests"] > 0
        assert r["startup_s"] >= 0.5  # the stand-in logs for 0.5 s before it listens
        assert r["graphs"] == 6 and r["graph_mib"] == pytest.approx(0.05 * 1024)
        assert r["startup_phases"]["graph capture"] == 1.0
        assert r["engine"]["generation_tokens"] == r["output_tokens"]  # the trace only, not the warm-up
        assert r["engine"]["requests_finished"] == r["requests"]
    assert len({r["startup_s"] for r in runs.values()}) == 1  # one server for every workload
    single = [r for (load, _), r in runs.items() if load == "3rps-c1"]
    assert all(r["concurrency"] == 1 and r["max_in_flight"] == 1 and r["rate"] == 3.0 for r in single)
    assert all(r["concurrency"] is None and r["rate"] == 4.0 for (load, _), r in runs.items() if load == "4rps")
    side = data["side_by_side"]
    assert set(side) == {"4 req/s, greedy", "4 req/s, sampled, temperature 0.8", "single stream, 3 req/s, greedy",
                         "single stream, 3 req/s, sampled, temperature 0.8"}
    assert side["4 req/s, greedy"]["vllm"]["ratio.itl_ms.p50"] == pytest.approx(1.0)
    md = (out / "serve.md").read_text()
    assert "### Side by side" in md and "| (vllm@T0.8@3rps-c1) vLLM defaults |" in md and "graph capture" in md
    assert "single stream, 3 req/s, sampled, temperature 0.8:" in md
    assert (out / "serve_compare.png").stat().st_size > 10_000
    assert (out / "serve_itl_cdf.png").stat().st_size > 10_000
    assert (out / "runs" / "3rps-c1-vllm-t0.8-seed0.json").exists() and (out / "runs" / "4rps-vllm-seed0.json").exists()
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0 and "0 runs" in again.stderr, again.stderr[-3000:]  # every workload was saved


def test_bench_config_child_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environments bench serve starts its children with: graphpool's (server and prime) without vLLM's
    site, vLLM's with only it."""
    from graphpool.bench.serve.foreign import VllmLaunch as Launch
    from graphpool.bench.serve.options import Load, ServeBenchConfig

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/vs", "/gp/site", "/gp/src"]))
    cfg = ServeBenchConfig(model="random:llama3.2-1b", dtype=None, loads=(Load(1.0),), duration_s=2.0, seeds=(0,),
                           configs=("vllm", "default"), budget="1GiB", prompt_mean=4.0, prompt_cap=8, output_mean=4.0,
                           output_cap=8, sigma=1.0, url=None, server_args=(), startup_timeout_s=9.0,
                           stop_timeout_s=9.0, resume=False, vllm=Launch(pythonpath="/vs"))
    assert cfg.child_env("graphpool")["PYTHONPATH"] == os.pathsep.join(["/gp/site", "/gp/src"])
    assert cfg.child_env("vllm")["PYTHONPATH"] == "/vs"
    with pytest.raises(ValueError, match="--vllm-model"):
        ServeBenchConfig(**{**vars(cfg), "model": "smollm2-135m-instruct"})


def test_graphpool_graph_facts_in_a_run() -> None:
    """graphpool's graphs and graph memory come from /metrics after the run, its start-up phases from the
    scrape right after start-up."""
    from graphpool.bench.latency import RequestTimeline
    from graphpool.bench.serve.client import ClientRun, RequestResult
    from graphpool.bench.serve.runs import summarize_run

    res = RequestResult(0, 0.0, 4, 3, RequestTimeline(0.0, 3, token_times=[0.1, 0.2, 0.3], finished=True), end_s=0.3,
                        prompt_tokens=4, completion_tokens=3)
    client = ClientRun(results=[res], duration_s=0.3, max_in_flight=1)
    boot = {"generation_tokens": 8, "startup_phase:model load": 2.0, "captures": 3}
    before = {"generation_tokens": 16, "captures": 4}
    after = {"generation_tokens": 19, "captures": 4, "resident": 4, "resident_bytes": 96 << 20, "arena_bytes": 64 << 20}
    run, _ = summarize_run("default", "d", 0, "m", 1.0, 1.0, client, before, after, 7.0, (0.1, False), boot=boot,
                           temperature=0.8)
    assert run.graphs == 4 and run.graph_mib == 96 and run.arena_mib == 64 and run.temperature == 0.8
    assert run.startup_phases == {"model load": 2.0} and run.startup_captures == 3
    assert run.engine == {"generation_tokens": 3} and run.serving["captures"] == 0
