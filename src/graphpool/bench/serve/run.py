"""`graphpool bench serve`: a live server per configuration (graphpool's, or vLLM's side by side), driven by a
streaming openai client.

For each configuration and seed: start the server as a subprocess (start-up = process start to ready: GET
/health 200, or for a foreign server /v1/models), scrape /metrics, then per load (--loads) and temperature: one
untimed warm-up completion, a seeded Poisson trace of streaming completions between two /metrics scrapes; stop
the server (SIGTERM, then SIGKILL). Each run is saved under <out>/runs; the report covers every run there, so a long
benchmark can be split over several calls (--resume skips the runs already saved).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from graphpool.bench import common
from graphpool.bench.common import progress
from graphpool.bench.serve import compare
from graphpool.bench.serve.attribution import attribute, attribute_ttft
from graphpool.bench.serve.client import ClientRun, run_trace
from graphpool.bench.serve.clients import run_trace_processes
from graphpool.bench.serve.configs import (
    ServeConfig,
    full_pool_sizes,
    ladder_size,
    pick_config,
    serve_configs,
)
from graphpool.bench.serve.foreign import VllmLogInfo, parse_vllm_log, vllm_command
from graphpool.bench.serve.options import Load, ServeBenchConfig, add_args, config_from_args
from graphpool.bench.serve.report import write_serve_report
from graphpool.bench.serve.runs import run_stem, save_run, summarize_run
from graphpool.bench.serve.server import (
    ServerFailed,
    ServerProcess,
    connect,
    fetch_timeline,
    free_port,
    launch,
    scrape,
    start_server,
    wait_warmup,
    warm_up,
)
from graphpool.bench.workload import TraceRequest, generate_trace, summarize_trace
from graphpool.engine.timeline import records_from_export

__all__ = ["ServeBenchConfig", "add_args", "config_from_args", "main", "run_serve_bench"]


@dataclass(frozen=True)
class Workload:
    """One load's trace at one temperature against a live server: what the client saw and the server's counters."""

    load: Load
    temperature: float
    top_p: float
    client: ClientRun
    before: dict[str, float]
    after: dict[str, float]
    timeline: dict[str, object] | None


def run_one(cfg: ServeBenchConfig, sc: ServeConfig, seed: int, out_dir: Path) -> None:
    """One server of configuration ``sc``: started (or connected to), every workload (load x temperature) sent
    to it in turn, stopped; then one saved run per workload."""
    traces = {load: generate_trace(cfg.trace(seed, load)) for load in cfg.loads}
    name = f"({sc.key}) {sc.label}, seed {seed}"
    where = f"existing server {cfg.url}" if cfg.url else f"server flags: {shlex.join(sc.flags) or '(none)'}"
    progress(f"{name}: {' + '.join(f'{len(t)} requests ({load.tag})' for load, t in traces.items())} over "
             f"{cfg.duration_s:g} s each x temperatures {' '.join(f'{t:g}' for t in cfg.temperatures)}; {where}")
    server = connect(cfg.url, foreign=sc.foreign) if cfg.url else _start(cfg, sc, seed, out_dir)
    if not cfg.url:
        progress(f"{name}: ready {server.startup_s:.1f} s after process start (log {server.log_path})")
    timelines = cfg.step_timeline and not sc.foreign
    workloads = []
    try:
        boot = scrape(server.url, engine_series=not sc.foreign)  # right after start-up, before any request
        if not sc.foreign and boot.get("warmup_pending", 0) > 0:
            # NOTE: the workloads measure serving, not the server's first second: they wait for its deferred captures
            progress(f"{name}: {boot['warmup_pending']:.0f} warm-up graphs captured while idle, "
                     f"{wait_warmup(server.url, cfg.startup_timeout_s):.2f} s after ready")
        model = _served_model(server.url)
        for load, trace in traces.items():
            for temp in cfg.temperatures:
                top_p = cfg.top_p if temp > 0 else 1.0
                label = _workload_name(name, cfg.load_tag(load), temp, top_p)
                warm = warm_up(server.url, model, list(range(1, 9)) if cfg.token_ids else "the of and to", temp,
                               top_p=top_p)
                progress(f"{label}: untimed warm-up completion {warm:.2f} s")
                before: dict[str, float] = {}
                # NOTE: scraped once the clients' own untimed requests are done: the counters cover the trace only
                client = run_trace_processes(
                    server.url, model, trace, seed, cfg.token_ids, load.concurrency, label, cfg.client_processes,
                    temperature=temp, top_p=top_p,
                    on_ready=lambda before=before: before.update(scrape(server.url, engine_series=not sc.foreign)))
                after = scrape(server.url, engine_series=not sc.foreign)
                workloads.append(Workload(load, temp, top_p, client, before, after,
                                          fetch_timeline(server.url) if timelines else None))
    finally:
        stop = server.stop(cfg.stop_timeout_s)
    # NOTE: read once the server has exited, so its log is complete
    info = parse_vllm_log(server.log_path.read_text(errors="replace")) if sc.foreign and not cfg.url else None
    for w in workloads:
        _save(cfg, sc, seed, out_dir, w, boot, server.startup_s, stop, info)


def _workload_name(server: str, load_tag: str, temperature: float, top_p: float) -> str:
    """A workload in the progress lines: its server's name, its load (where the bench has several), its T (and
    top-p where it cuts)."""
    cut = f" top-p {top_p:g}" if top_p < 1 else ""
    return f"{server}, {load_tag + ', ' if load_tag else ''}T={temperature:g}{cut}"


def _start(cfg: ServeBenchConfig, sc: ServeConfig, seed: int, out_dir: Path) -> ServerProcess:
    log = out_dir / "logs" / f"{sc.key}-seed{seed}.log"
    if sc.foreign:
        port = free_port()
        cmd = vllm_command(cfg.vllm, cfg.model, cfg.dtype, cfg.server_args, sc.flags, "127.0.0.1", port)
        return launch(cmd, f"http://127.0.0.1:{port}", log, cfg.startup_timeout_s, cfg.child_env(sc.server),
                      foreign=True)
    timeline_flag = ["--record-step-timeline"] if cfg.step_timeline else []
    return start_server([*cfg.engine_flags(), *timeline_flag, *sc.flags], log, cfg.startup_timeout_s,
                        cfg.child_env(sc.server))


def _save(cfg: ServeBenchConfig, sc: ServeConfig, seed: int, out_dir: Path, w: Workload, boot: dict[str, float],
          startup_s: float, stop: tuple[float, bool], info: VllmLogInfo | None) -> None:
    tag = cfg.load_tag(w.load)
    name = _workload_name(f"({sc.key}) {sc.label}, seed {seed}", tag, w.temperature, w.top_p)
    client, causes = w.client, None
    stem = run_stem(sc.key, seed, w.temperature, tag, w.top_p)
    if w.timeline is not None:
        ok = [r for r in client.results if r.error is None]
        # NOTE: the server's timeline holds every step since it started: this workload's begin at its time 0
        steps = [s for s in records_from_export(w.timeline) if s.start >= client.t0_monotonic]
        causes = attribute([[client.t0_monotonic + t for t in r.timeline.token_times] for r in ok], steps,
                           threshold_ms=cfg.gap_threshold_ms, late_spans=[client.late_spans[r.worker] for r in ok])
        first = [(r, ttft) for r in ok if (ttft := r.timeline.ttft()) is not None]
        sent = [client.t0_monotonic + r.timeline.arrival_s for r, _ in first]
        causes["ttft_tail"] = attribute_ttft([(a, a + ttft) for a, (_, ttft) in zip(sent, first, strict=True)],
                                             steps, late_spans=[client.late_spans[r.worker] for r, _ in first])
        (out_dir / "timelines").mkdir(parents=True, exist_ok=True)
        (out_dir / "timelines" / f"{stem}.json").write_text(json.dumps(
            {**w.timeline, "client_t0_monotonic": client.t0_monotonic}) + "\n")
        progress(f"{name}: {causes['gaps']} gaps over {causes['threshold_ms']:g} ms: "
                 + ", ".join(f"{k} {v}" for k, v in causes["counts"].items() if v))
    run, itls = summarize_run(sc.key, sc.label, seed, cfg.model, w.load.rate, cfg.duration_s, client, w.before,
                              w.after, startup_s, stop, causes, boot=boot, temperature=w.temperature, top_p=w.top_p,
                              server=sc.server, log_info=info, concurrency=w.load.concurrency, load=tag)
    save_run(out_dir / "runs", run, itls)
    progress(f"{name}: {run.errors} errors, {run.itl_gaps} ITL gaps, ITL p50/p99/p99.9 "
             f"{run.itl_ms['p50']:.1f}/{run.itl_ms['p99']:.1f}/{run.itl_ms['p99.9']:.1f} ms, TTFT p99 "
             f"{run.ttft_ms['p99']:.0f} ms, {run.output_tok_s:.0f} tok/s, {run.graphs:.0f} graphs in "
             f"{run.graph_mib:.0f} MiB; stopped in {stop[0]:.1f} s{' (SIGKILL)' if stop[1] else ''}")


def _served_model(url: str) -> str:
    return str(_model_card(url)["id"])


def _model_card(url: str) -> dict[str, object]:
    import httpx

    r = httpx.get(f"{url}/v1/models", timeout=30)
    r.raise_for_status()
    return dict(r.json()["data"][0])


def prime(cfg: ServeBenchConfig, out_dir: Path, flags: Sequence[str]) -> None:
    """Untimed, before every timed run: one server with graphs off decodes, one request at a time, across every
    64-token interval of context the traces can reach, so the Triton decode kernel's variants (one per bound,
    see trace/warmup.py) are compiled into the on-disk cache and no timed run pays a JIT compile."""
    log = out_dir / "logs" / "prime.log"
    server = start_server([*cfg.engine_flags(), *flags], log, cfg.startup_timeout_s, cfg.child_env("graphpool"))
    try:
        card = _model_card(server.url)
        limit = min(cfg.prompt_cap + cfg.output_cap, int(card.get("max_model_len", 2048)))  # type: ignore[arg-type]
        step = 64
        trace = [TraceRequest(i, 0.0, p, min(step, limit - p)) for i, p in enumerate(range(1, limit - 1, step))]
        run = asyncio.run(run_trace(server.url, str(card["id"]), trace, 0, cfg.token_ids, 1, "prime"))
    finally:
        server.stop(cfg.stop_timeout_s)
    gaps = [g for r in run.results for g in r.timeline.itls()]
    errors = sum(r.error is not None for r in run.results)
    progress(f"prime (untimed, graphs off): {len(trace)} requests up to context {limit} in {run.duration_s:.1f} s "
             f"after a {server.startup_s:.1f} s start-up; slowest gap {1e3 * max(gaps, default=0.0):.0f} ms; "
             f"{errors} errors")
    if errors:
        raise ServerFailed(f"the prime run had {errors} errors, e.g. {run.errors_sample[:2]} (log {log})")


def run_serve_bench(cfg: ServeBenchConfig, out_dir: Path, argv: Sequence[str] | None = None,
                    report_only: bool = False) -> list[object]:
    """Runs what is to run (all of it, or with --resume what <out>/runs lacks) and writes the report over every
    run saved there; ``report_only``: only the report (runs gathered from several calls into one --out)."""
    env = common.collect_env(argv)
    env = common.EnvInfo(**{**vars(env), "gpu": _gpu_name()})
    if report_only:
        env_path = out_dir / "env.json"
        if env_path.exists():  # the machine the runs ran on, not this one
            env = common.EnvInfo(**json.loads(env_path.read_text()))
        print(env.header_markdown(), flush=True)
        _, body, targets = write_serve_report(out_dir, env, {"config": cfg}, section=compare.section)
        print(body, flush=True)
        return targets
    print(env.header_markdown(), flush=True)
    configs = serve_configs(ladder_size(cfg.server_args), cfg.budget, full_pool_sizes(cfg.server_args))
    n = len(cfg.configs)
    todo = [(pick_config(k, configs), s) for s in cfg.seeds
            # NOTE: the order rotates by one config per seed (its value: the same when seeds are split over
            # calls), so no configuration always runs first
            for k in (cfg.configs[s % n:] + cfg.configs[:s % n])]
    if cfg.resume:
        todo = [(sc, s) for sc, s in todo if not all(
            (out_dir / "runs" / f"{run_stem(sc.key, s, t, cfg.load_tag(load))}.json").exists()
            for load in cfg.loads for t in cfg.temperatures)]
    trace0 = summarize_trace(generate_trace(cfg.trace(cfg.seeds[0], cfg.loads[0])), cfg.duration_s)
    progress(f"serve bench: {len(todo)} runs ({' '.join(cfg.configs)} x seeds {list(cfg.seeds)}), "
             f"model {cfg.model}, seed {cfg.seeds[0]} trace: {trace0['requests']} requests, "
             f"{trace0.get('output_tokens', 0)} output tokens")
    if todo:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "env.json").write_text(json.dumps(vars(env), indent=1) + "\n")
    # NOTE: the prime fills graphpool's Triton cache: nothing to prime for foreign servers only
    if todo and cfg.prime and not cfg.url and any(not sc.foreign for sc, _ in todo):
        prime(cfg, out_dir, configs["no-graphs"].flags)
    for sc, seed in todo:
        run_one(cfg, sc, seed, out_dir)
        # NOTE: rewritten after every run, so a benchmark cut short keeps what it measured
        write_serve_report(out_dir, env, {"config": cfg, "trace_seed0": trace0}, plot=False,
                           section=compare.section)
    _, body, targets = write_serve_report(out_dir, env, {"config": cfg, "trace_seed0": trace0},
                                             section=compare.section)
    print(body, flush=True)
    return targets


def _gpu_name() -> str:
    """The server's GPU, from nvidia-smi: torch here would open a CUDA context that the server's KV cache
    sizing (a share of free memory) would then see."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, check=False)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    return common.collect_env([]).gpu


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark; the targets are printed in the report (the exit status does not judge them)."""
    try:
        run_serve_bench(config_from_args(args), args.out, argv, report_only=args.report_only)
    except RuntimeError as exc:  # the server did not start, or died: the CLI prints the reason
        raise ValueError(str(exc)) from exc
