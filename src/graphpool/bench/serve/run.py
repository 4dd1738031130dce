"""`graphpool bench serve`: a live `graphpool serve` per configuration, driven by a streaming openai client.

For each configuration and seed: start the server as a subprocess (start-up = process start to GET /health
200), scrape /metrics, send a seeded Poisson trace of streaming completions, scrape /metrics again, stop the
server (SIGTERM, then SIGKILL). Each run is saved under <out>/runs as it finishes; the report covers every run
there, so a long benchmark can be split over several calls (--resume skips the runs already saved).
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
from graphpool.bench.serve.attribution import attribute
from graphpool.bench.serve.client import run_trace
from graphpool.bench.serve.clients import default_processes, run_trace_processes
from graphpool.bench.serve.configs import (
    CONFIG_HELP,
    CONFIG_LABELS,
    DEFAULT_CONFIGS,
    ServeConfig,
    ladder_size,
    serve_configs,
)
from graphpool.bench.serve.report import save_run, summarize_run, write_serve_report
from graphpool.bench.serve.server import (
    ServerFailed,
    ServerProcess,
    connect,
    fetch_timeline,
    scrape,
    start_server,
)
from graphpool.bench.workload import TraceConfig, TraceRequest, generate_trace, summarize_trace
from graphpool.engine.timeline import records_from_export


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str
    dtype: str | None
    rate: float
    duration_s: float
    seeds: tuple[int, ...]
    configs: tuple[str, ...]
    budget: str
    prompt_mean: float
    prompt_cap: int
    output_mean: float
    output_cap: int
    sigma: float
    concurrency: int | None
    url: str | None
    server_args: tuple[str, ...]
    startup_timeout_s: float
    stop_timeout_s: float
    resume: bool
    prime: bool = True
    step_timeline: bool = True  # the server keeps a step timeline, and the client's gaps are attributed by it
    client_processes: int = 1  # client processes streaming the trace (serve/clients.py says why)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("serve bench: --seeds must be >= 1")
        unknown = [c for c in self.configs if c not in CONFIG_LABELS]
        if unknown or not self.configs:
            raise ValueError(f"serve bench: --configs are names of {', '.join(CONFIG_LABELS)}, "
                             f"got {' '.join(self.configs)!r}")
        if self.url and len(self.configs) != 1:
            raise ValueError("serve bench: with --url (an existing server) give exactly one --configs name, "
                             "the one that server runs")
        if self.client_processes < 1:
            raise ValueError(f"serve bench: --client-processes must be >= 1, got {self.client_processes}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"serve bench: --concurrency must be >= 1, got {self.concurrency}")
        if not (self.startup_timeout_s > 0 and self.stop_timeout_s > 0):
            raise ValueError("serve bench: the start-up and stop timeouts must be > 0")
        self.trace(0)  # TraceConfig checks rate, duration and lengths

    @property
    def token_ids(self) -> bool:
        return self.model.startswith("random:")

    def trace(self, seed: int) -> TraceConfig:
        return TraceConfig(rate=self.rate, duration_s=self.duration_s, prompt_mean=self.prompt_mean,
                           prompt_cap=self.prompt_cap, output_mean=self.output_mean, output_cap=self.output_cap,
                           sigma=self.sigma, seed=seed)

    def engine_flags(self) -> list[str]:
        flags = ["--model", self.model] + (["--dtype", self.dtype] if self.dtype else [])
        return [*flags, *self.server_args]


def run_one(cfg: ServeBenchConfig, sc: ServeConfig, seed: int, out_dir: Path) -> None:
    trace = generate_trace(cfg.trace(seed))
    name = f"({sc.key}) {sc.label}, seed {seed}"
    where = f"existing server {cfg.url}" if cfg.url else f"server flags: {shlex.join(sc.flags) or '(none)'}"
    progress(f"{name}: {len(trace)} requests over {cfg.duration_s:g} s; {where}")
    if cfg.url:
        server: ServerProcess = connect(cfg.url)
    else:
        log = out_dir / "logs" / f"{sc.key}-seed{seed}.log"
        timeline_flag = ["--record-step-timeline"] if cfg.step_timeline else []
        server = start_server([*cfg.engine_flags(), *timeline_flag, *sc.flags], log, cfg.startup_timeout_s)
        progress(f"{name}: healthy {server.startup_s:.1f} s after process start (log {log})")
    try:
        before = scrape(server.url)
        model = _served_model(server.url)
        client = run_trace_processes(server.url, model, trace, seed, cfg.token_ids, cfg.concurrency, name,
                                     cfg.client_processes)
        after = scrape(server.url)
        timeline = fetch_timeline(server.url) if cfg.step_timeline else None
    finally:
        stop = server.stop(cfg.stop_timeout_s)
    causes = None
    if timeline is not None:
        ok = [r for r in client.results if r.error is None]
        causes = attribute([[client.t0_monotonic + t for t in r.timeline.token_times] for r in ok],
                           records_from_export(timeline), late_spans=[client.late_spans[r.worker] for r in ok])
        (out_dir / "timelines").mkdir(parents=True, exist_ok=True)
        (out_dir / "timelines" / f"{sc.key}-seed{seed}.json").write_text(json.dumps(
            {**timeline, "client_t0_monotonic": client.t0_monotonic}) + "\n")
        progress(f"{name}: {causes['gaps']} gaps over {causes['threshold_ms']:g} ms: "
                 + ", ".join(f"{k} {v}" for k, v in causes["counts"].items() if v))
    run, itls = summarize_run(sc.key, sc.label, seed, cfg.model, cfg.rate, cfg.duration_s, client, before, after,
                              server.startup_s, stop, causes)
    save_run(out_dir / "runs", run, itls)
    progress(f"{name}: {run.errors} errors, {run.itl_gaps} ITL gaps, ITL p50/p99/p99.9 "
             f"{run.itl_ms['p50']:.1f}/{run.itl_ms['p99']:.1f}/{run.itl_ms['p99.9']:.1f} ms, TTFT p99 "
             f"{run.ttft_ms['p99']:.0f} ms, {run.output_tok_s:.0f} tok/s, captures serving "
             f"{run.serving['captures']:.0f}; stopped in {stop[0]:.1f} s{' (SIGKILL)' if stop[1] else ''}")


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
    server = start_server([*cfg.engine_flags(), *flags], log, cfg.startup_timeout_s)
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
        _, body, targets = write_serve_report(out_dir, env, {"config": cfg})
        print(body, flush=True)
        return targets
    print(env.header_markdown(), flush=True)
    configs = serve_configs(ladder_size(cfg.server_args), cfg.budget)
    n = len(cfg.configs)
    todo = [(configs[k], s) for s in cfg.seeds
            # NOTE: the order rotates by one config per seed (its value: the same when seeds are split over
            # calls), so no configuration always runs first
            for k in (cfg.configs[s % n:] + cfg.configs[:s % n])]
    if cfg.resume:
        todo = [(sc, s) for sc, s in todo if not (out_dir / "runs" / f"{sc.key}-seed{s}.json").exists()]
    trace0 = summarize_trace(generate_trace(cfg.trace(cfg.seeds[0])), cfg.duration_s)
    progress(f"serve bench: {len(todo)} runs ({' '.join(cfg.configs)} x seeds {list(cfg.seeds)}), "
             f"model {cfg.model}, seed {cfg.seeds[0]} trace: {trace0['requests']} requests, "
             f"{trace0.get('output_tokens', 0)} output tokens")
    if todo:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "env.json").write_text(json.dumps(vars(env), indent=1) + "\n")
    if todo and cfg.prime and not cfg.url:
        prime(cfg, out_dir, configs["no-graphs"].flags)
    for sc, seed in todo:
        run_one(cfg, sc, seed, out_dir)
        # NOTE: rewritten after every run, so a benchmark cut short keeps what it measured
        write_serve_report(out_dir, env, {"config": cfg, "trace_seed0": trace0}, plot=False)
    _, body, targets = write_serve_report(out_dir, env, {"config": cfg, "trace_seed0": trace0})
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


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="the server's --model: the embedded default, a .gguf, or random:<preset> (token-id prompts)")
    p.add_argument("--dtype", default=None, help="the server's --dtype (default: the server's)")
    p.add_argument("--rate", type=float, default=16.0, help="mean requests per second (Poisson)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration (trace seeds first-seed..)")
    p.add_argument("--first-seed", type=int, default=0, help="first trace seed (split seeds over calls)")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=list(CONFIG_LABELS),
                   metavar="NAME", help=f"server configurations, of: {CONFIG_HELP} (default: %(default)s)")
    p.add_argument("--budget", default="256MiB", help="--graph-memory-budget of configuration budget")
    p.add_argument("--prompt-mean", type=float, default=300.0, help="lognormal prompt length mean (tokens)")
    p.add_argument("--prompt-cap", type=int, default=1024)
    p.add_argument("--max-tokens-mean", type=float, default=256.0, help="lognormal max_tokens mean (ignore_eos)")
    p.add_argument("--max-tokens-cap", type=int, default=768)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of both lengths")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--url", default=None, help="an existing server (one --configs name; never stopped)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more server flag, e.g. --server-arg=--max-num-seqs=64 (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for the server to get healthy")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    p.add_argument("--no-prime", dest="prime", action="store_false",
                   help="skip the untimed prime run (graphs off, one request at a time across every context "
                        "length) that fills the Triton compile cache before the timed runs")
    p.add_argument("--client-processes", type=int, default=None,
                   help="client processes sharing the trace (default: one per 4 cores, at most 4), so the client's "
                        "event loop does not fall behind the server")
    p.add_argument("--no-step-timeline", dest="step_timeline", action="store_false",
                   help="start the servers without --record-step-timeline (no attribution of the ITL gaps)")
    p.add_argument("--resume", action="store_true", help="skip the runs already saved under <out>/runs")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild the report from <out>/runs (and the GPU header from <out>/env.json)")
    p.add_argument("--out", type=Path, default=Path("results/serve"))


def config_from_args(args: argparse.Namespace) -> ServeBenchConfig:
    if args.seeds < 1:
        raise ValueError(f"serve bench: --seeds must be >= 1, got {args.seeds}")
    return ServeBenchConfig(
        model=args.model, dtype=args.dtype, rate=args.rate, duration_s=args.duration,
        seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)), configs=tuple(args.configs),
        budget=args.budget, prompt_mean=args.prompt_mean, prompt_cap=args.prompt_cap,
        output_mean=args.max_tokens_mean, output_cap=args.max_tokens_cap, sigma=args.sigma,
        concurrency=args.concurrency, url=args.url, server_args=tuple(args.server_arg),
        startup_timeout_s=args.startup_timeout, stop_timeout_s=args.stop_timeout, resume=args.resume,
        prime=args.prime, step_timeline=args.step_timeline,
        client_processes=args.client_processes if args.client_processes is not None else default_processes())


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark; the targets are printed in the report (the exit status does not judge them)."""
    try:
        run_serve_bench(config_from_args(args), args.out, argv, report_only=args.report_only)
    except RuntimeError as exc:  # the server did not start, or died: the CLI prints the reason
        raise ValueError(str(exc)) from exc
