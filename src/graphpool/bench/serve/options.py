"""`bench serve`'s settings: the command line and the frozen configuration it becomes."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from graphpool.bench.serve.attribution import THRESHOLD_MS
from graphpool.bench.serve.clients import default_processes
from graphpool.bench.serve.configs import (
    CONFIG_HELP,
    CONFIG_LABELS,
    DEFAULT_CONFIGS,
    VLLM_CONFIGS,
    custom_config,
)
from graphpool.bench.serve.foreign import VLLM_SITE, VllmLaunch, graphpool_env, vllm_env
from graphpool.bench.workload import TraceConfig


@dataclass(frozen=True)
class Load:
    """A workload's arrivals: Poisson ``rate`` requests/s, at most ``concurrency`` in flight (None: no cap)."""

    rate: float
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"serve bench: a load's concurrency must be >= 1, got {self.concurrency}")

    @classmethod
    def parse(cls, text: str) -> Load:
        """``RATE`` or ``RATE:CONCURRENCY``, e.g. ``16`` or ``2:1`` (single stream)."""
        rate, _, cap = text.partition(":")
        try:
            return cls(float(rate), int(cap) if cap else None)
        except ValueError as e:
            raise ValueError(f"serve bench: a load is RATE or RATE:CONCURRENCY (e.g. 16 or 2:1), got {text!r}: "
                             f"{e}") from None

    @property
    def tag(self) -> str:
        """The load in run names (files, report rows): ``16rps``, ``2rps-c1``."""
        return f"{self.rate:g}rps" + (f"-c{self.concurrency}" if self.concurrency is not None else "")


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str
    dtype: str | None
    loads: tuple[Load, ...]  # one workload each (per temperature), against the same server
    duration_s: float
    seeds: tuple[int, ...]
    configs: tuple[str, ...]
    budget: str
    prompt_mean: float
    prompt_cap: int
    output_mean: float
    output_cap: int
    sigma: float
    url: str | None
    server_args: tuple[str, ...]
    startup_timeout_s: float
    stop_timeout_s: float
    resume: bool
    prime: bool = True
    step_timeline: bool = True  # the server keeps a step timeline, and the client's gaps are attributed by it
    client_processes: int = 1  # client processes streaming the trace (serve/clients.py says why)
    temperatures: tuple[float, ...] = (0.0,)  # one workload each, against the same server (0: greedy)
    top_p: float = 1.0  # every sampled workload's requests' top_p (1: the field left out)
    gap_threshold_ms: float = THRESHOLD_MS  # client gaps over this are attributed to the server's steps
    vllm: VllmLaunch = field(default_factory=VllmLaunch)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("serve bench: --seeds must be >= 1")
        if not self.configs:
            raise ValueError(f"serve bench: --configs are names of {', '.join(CONFIG_LABELS)} or NAME=FLAGS")
        keys = [c if c in CONFIG_LABELS else custom_config(c).key for c in self.configs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"serve bench: --configs names are distinct, got {' '.join(keys)}")
        if self.url and len(self.configs) != 1:
            raise ValueError("serve bench: with --url (an existing server) give exactly one --configs name, "
                             "the one that server runs")
        if self.client_processes < 1:
            raise ValueError(f"serve bench: --client-processes must be >= 1, got {self.client_processes}")
        if not self.loads or len(set(self.loads)) != len(self.loads):
            raise ValueError(f"serve bench: --loads are distinct, got {' '.join(x.tag for x in self.loads)}")
        if not self.gap_threshold_ms > 0:
            raise ValueError(f"serve bench: --gap-threshold-ms must be > 0, got {self.gap_threshold_ms}")
        if not (self.startup_timeout_s > 0 and self.stop_timeout_s > 0):
            raise ValueError("serve bench: the start-up and stop timeouts must be > 0")
        if not self.temperatures or any(t < 0 for t in self.temperatures) or len(set(self.temperatures)) != len(
                self.temperatures):
            raise ValueError(f"serve bench: --temperatures are distinct numbers >= 0, got {self.temperatures}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"serve bench: --top-p is in (0, 1], got {self.top_p}")
        if not self.url and any(c in VLLM_CONFIGS for c in self.configs):
            self.vllm.resolved_model_dir(self.model)  # raises without a model folder
        for load in self.loads:
            self.trace(0, load)  # TraceConfig checks rate, duration and lengths

    @property
    def token_ids(self) -> bool:
        return self.model.startswith("random:")

    def load_tag(self, load: Load) -> str:
        """``load``'s part of a run's name: none when the bench has one load (the names runs had before loads)."""
        return load.tag if len(self.loads) > 1 else ""

    def trace(self, seed: int, load: Load) -> TraceConfig:
        return TraceConfig(rate=load.rate, duration_s=self.duration_s, prompt_mean=self.prompt_mean,
                           prompt_cap=self.prompt_cap, output_mean=self.output_mean, output_cap=self.output_cap,
                           sigma=self.sigma, seed=seed)

    def engine_flags(self) -> list[str]:
        flags = ["--model", self.model] + (["--dtype", self.dtype] if self.dtype else [])
        return [*flags, *self.server_args]

    def child_env(self, server: str) -> dict[str, str]:
        """The environment of a server child of kind ``server`` ("graphpool" or "vllm"), from this process's:
        vLLM's PYTHONPATH for vLLM only, and never for graphpool."""
        if server == "graphpool":
            return graphpool_env(os.environ, self.vllm.pythonpath)
        return vllm_env(os.environ, self.vllm.pythonpath)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="the server's --model: the embedded default, a .gguf, or random:<preset> (token-id prompts)")
    p.add_argument("--dtype", default=None, help="the server's --dtype (default: the server's)")
    p.add_argument("--rate", type=float, default=16.0, help="mean requests per second (Poisson)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration (trace seeds first-seed..)")
    p.add_argument("--first-seed", type=int, default=0, help="first trace seed (split seeds over calls)")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="NAME",
                   help=f"server configurations, of: {CONFIG_HELP} (default: %(default)s)")
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0], metavar="T",
                   help="one workload per temperature, each against the same server after one untimed request at "
                        "that temperature, e.g. 0 0.8 (default: 0, greedy)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="top_p of every sampled workload's requests, as a model's generation_config.json may "
                        "recommend (default: 1, the field left out)")
    p.add_argument("--budget", default="256MiB", help="--graph-memory-budget of configuration budget")
    p.add_argument("--prompt-mean", type=float, default=300.0, help="lognormal prompt length mean (tokens)")
    p.add_argument("--prompt-cap", type=int, default=1024)
    p.add_argument("--max-tokens-mean", type=float, default=256.0, help="lognormal max_tokens mean (ignore_eos)")
    p.add_argument("--max-tokens-cap", type=int, default=768)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal shape of both lengths")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--loads", nargs="+", default=None, metavar="RATE[:CONCURRENCY]",
                   help="several loads, each a workload against the same server (one start per configuration), "
                        "e.g. 16 2:1 (16 req/s uncapped, then a single stream at 2 req/s); replaces --rate and "
                        "--concurrency")
    p.add_argument("--url", default=None, help="an existing server (one --configs name; never stopped)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more graphpool server flag, e.g. --server-arg=--max-num-seqs=64 (repeatable; vLLM "
                        "gets graphpool's max-model-len, max-num-seqs and seed from them)")
    v = p.add_argument_group("vLLM (configurations vllm, vllm-eager)")
    v.add_argument("--vllm-python", default="python3", help="the interpreter that runs vLLM (default: %(default)s)")
    v.add_argument("--vllm-model", default=None, metavar="PATH",
                   help="vLLM's model folder (default for random:<preset>: /tmp/vllm-models/<preset>, dummy weights)")
    v.add_argument("--vllm-pythonpath", default=os.environ.get("VK_SITE", VLLM_SITE), metavar="PATHS",
                   help="the vLLM child's whole PYTHONPATH; these entries are also taken out of graphpool "
                        "children's PYTHONPATH (default: $VK_SITE or %(default)s)")
    v.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                   help="one more vLLM flag, e.g. --vllm-arg=--gpu-memory-utilization=0.5 (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds for the server to get healthy")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    p.add_argument("--no-prime", dest="prime", action="store_false",
                   help="skip the untimed prime run (graphs off, one request at a time across every context "
                        "length) that fills the Triton compile cache before the timed runs")
    p.add_argument("--client-processes", type=int, default=None,
                   help="client processes sharing the trace (default: one per 4 cores, at most 4), so the client's "
                        "event loop does not fall behind the server")
    p.add_argument("--gap-threshold-ms", type=float, default=THRESHOLD_MS, metavar="MS",
                   help="attribute the client's inter-token gaps over this to the server's steps (default %(default)s; "
                        "e.g. 2x the median gap to see the tail of a single stream)")
    p.add_argument("--no-step-timeline", dest="step_timeline", action="store_false",
                   help="start the servers without --record-step-timeline (no attribution of the ITL gaps)")
    p.add_argument("--resume", action="store_true", help="skip the runs already saved under <out>/runs")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild the report from <out>/runs (and the GPU header from <out>/env.json)")
    p.add_argument("--out", type=Path, default=Path("results/serve"))


def config_from_args(args: argparse.Namespace) -> ServeBenchConfig:
    if args.seeds < 1:
        raise ValueError(f"serve bench: --seeds must be >= 1, got {args.seeds}")
    vllm = VllmLaunch(python=args.vllm_python, model_dir=args.vllm_model, pythonpath=args.vllm_pythonpath,
                      args=tuple(args.vllm_arg))
    loads = tuple(Load.parse(x) for x in args.loads) if args.loads else (Load(args.rate, args.concurrency),)
    return ServeBenchConfig(
        model=args.model, dtype=args.dtype, loads=loads, duration_s=args.duration,
        seeds=tuple(range(args.first_seed, args.first_seed + args.seeds)), configs=tuple(args.configs),
        budget=args.budget, prompt_mean=args.prompt_mean, prompt_cap=args.prompt_cap,
        output_mean=args.max_tokens_mean, output_cap=args.max_tokens_cap, sigma=args.sigma,
        url=args.url, server_args=tuple(args.server_arg),
        startup_timeout_s=args.startup_timeout, stop_timeout_s=args.stop_timeout, resume=args.resume,
        prime=args.prime, step_timeline=args.step_timeline,
        client_processes=args.client_processes if args.client_processes is not None else default_processes(),
        temperatures=tuple(args.temperatures), top_p=args.top_p, gap_threshold_ms=args.gap_threshold_ms, vllm=vllm)
