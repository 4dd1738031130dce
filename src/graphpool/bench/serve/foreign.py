"""A foreign OpenAI server under `bench serve` (vLLM): its command line, its environment apart from
graphpool's, and what its log says about its CUDA graphs and start-up."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

VLLM_MODELS = "/tmp/vllm-models"  # where shared/device/vllm/install.sh unpacks the model folders
VLLM_SITE = "/tmp/vllm-site"  # where it installs vLLM (PYTHONPATH of the vLLM child)
RANDOM_PREFIX = "random:"


@dataclass(frozen=True)
class VllmLaunch:
    """How to start vLLM: the interpreter, the model folder, the vLLM child's PYTHONPATH, extra flags."""

    python: str = "python3"
    model_dir: str | None = None  # None: /tmp/vllm-models/<preset> for random:<preset>
    pythonpath: str = VLLM_SITE  # os.pathsep-separated; only the vLLM child sees it
    args: tuple[str, ...] = ()

    def resolved_model_dir(self, model: str) -> str:
        if self.model_dir:
            return self.model_dir
        preset = model.removeprefix(RANDOM_PREFIX)
        if not model.startswith(RANDOM_PREFIX) or ":" in preset:
            raise ValueError(f"serve bench: no vLLM model folder for {model!r} (only random:<preset> has a default, "
                             f"{VLLM_MODELS}/<preset>): give --vllm-model PATH")
        return f"{VLLM_MODELS}/{preset}"


def _entries(pythonpath: str | None) -> list[str]:
    return [p for p in (pythonpath or "").split(os.pathsep) if p]


def _under(path: str, roots: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in map(os.path.realpath, roots))


def graphpool_env(environ: Mapping[str, str], vllm_pythonpath: str) -> dict[str, str]:
    """The graphpool server child's environment: the parent's, less every PYTHONPATH entry of vLLM's (vLLM
    pins other fastapi, pydantic and openai versions than graphpool's server is tested with)."""
    env = dict(environ)
    foreign = _entries(vllm_pythonpath)
    kept = [p for p in _entries(env.get("PYTHONPATH")) if not _under(p, foreign)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


def vllm_env(environ: Mapping[str, str], vllm_pythonpath: str) -> dict[str, str]:
    """The vLLM child's environment: the parent's variables (install.sh env's VLLM_* and offline switches),
    with PYTHONPATH replaced by vLLM's own, so no graphpool site dir shadows vLLM's packages."""
    env = dict(environ)
    entries = _entries(vllm_pythonpath)
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        env.pop("PYTHONPATH", None)
    return env


def matched_flags(model: str, dtype: str | None, server_args: Sequence[str]) -> list[str]:
    """vLLM flags that give it graphpool's settings under ``server_args``: served model name, context length,
    batch size, seed and dtype (graphpool's default on CUDA: bfloat16); random:<preset> loads dummy weights."""
    from graphpool.engine.args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    known, _ = parser.parse_known_args(list(server_args))
    ec = engine_config_from_args(known, device="cpu")
    flags = ["--served-model-name", model, "--max-model-len", str(ec.max_model_len),
             "--max-num-seqs", str(ec.max_num_seqs), "--seed", str(ec.seed),
             "--dtype", dtype if dtype and dtype != "auto" else "bfloat16"]
    return [*flags, *(["--load-format", "dummy"] if model.startswith(RANDOM_PREFIX) else [])]


def vllm_command(launch: VllmLaunch, model: str, dtype: str | None, server_args: Sequence[str],
                 config_flags: Sequence[str], host: str, port: int) -> list[str]:
    """`vllm serve` as vLLM 0.26's module entry point (the `vllm` script may not be on PATH)."""
    return [launch.python, "-m", "vllm.entrypoints.cli.main", "serve", launch.resolved_model_dir(model),
            "--host", host, "--port", str(port), *matched_flags(model, dtype, server_args), *config_flags,
            *launch.args]


# NOTE: vLLM's own wording (gpu_model_runner / gpu_worker / backends / core); prefixes and timestamps vary
_CAPTURED = re.compile(r"Graph capturing finished in\s+([\d.]+)\s+secs?(?:,\s*took\s+(-?[\d.]+)\s*GiB)?")
_BAR = re.compile(r"Capturing CUDA graphs \(([^)]*)\)[^|\r\n]*\|[^|\r\n]*\|\s*(\d+)/(\d+)")
_SIZES = re.compile(r"cudagraph_capture_sizes['\"]?\s*[:=]\s*\[([\d,\s]*)\]")
_PHASES = {
    "model load": re.compile(r"Model loading took\s+[\d.]+\s*GiB(?:\s+memory)?\s+and\s+([\d.]+)\s*s"),
    "torch.compile": re.compile(r"torch\.compile takes\s+([\d.]+)\s*s in total"),
    "graph capture": _CAPTURED,
    "engine init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took\s+([\d.]+)\s*s"),
}


@dataclass(frozen=True)
class VllmLogInfo:
    graphs: float = math.nan  # graphs captured: the sum of the finished capture bars, else the capture sizes
    capture_sizes: float = math.nan  # batch sizes in cudagraph_capture_sizes
    graph_gib: float = math.nan  # free device memory the capture took, as vLLM measures it
    phases: dict[str, float] = field(default_factory=dict)  # start-up phases in seconds, by vLLM's log


def parse_vllm_log(text: str) -> VllmLogInfo:
    """Graph count, graph memory and start-up phases from a vLLM server log (tqdm bars redraw with \\r)."""
    bars: dict[str, int] = {}
    for label, done, total in _BAR.findall(text):
        if done == total:
            bars[label] = max(bars.get(label, 0), int(total))
    sizes = _SIZES.search(text)
    n_sizes = float(len([s for s in sizes.group(1).split(",") if s.strip()])) if sizes else math.nan
    captured = _CAPTURED.findall(text)
    graph_gib = math.nan
    if captured and captured[-1][1]:
        graph_gib = float(captured[-1][1])
    phases: dict[str, float] = {}
    for name, rx in _PHASES.items():
        if found := rx.findall(text):
            last = found[-1]  # a restart in the same log: its last start-up
            phases[name] = float(last[0] if isinstance(last, tuple) else last)
    return VllmLogInfo(graphs=float(sum(bars.values())) if bars else n_sizes, capture_sizes=n_sizes,
                       graph_gib=graph_gib, phases=phases)

