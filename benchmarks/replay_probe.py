"""A decode graph's replay, host and GPU, with a kernel switch on and off, and the host API calls of an engine step.

    python benchmarks/replay_probe.py [--model random:smollm2-135m] [--switch pdl] [--rounds 6]

Two engines in one process, the second with `--switch` off (EngineConfig.disabled_kernels), each with its bs 1
and bs 2 graphs captured; rounds alternate between them. Host: the wall time of one `replay()` call with the GPU
idle (synchronized before each), of a second replay right after it, queued behind the first while that runs (as
async scheduling launches a step), and of the bs 2 graph's replay queued behind the bs 1 graph's (another
executable graph: whether a launch waits only behind its own graph's run). GPU: 50 replays back to back between
two events, per replay. Then, in 100 decode steps of the first engine (one request, T=0.8), the host time of the
pool's replay call inside a step (no profiler), and torch's profiler over 20 more counts the host API calls a
step: copies, device allocations, event records, kernel and graph launches. Needs CUDA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from host_probe import timed_parts

REPLAYS = 50
PROFILED_STEPS = 20
COUNTED = ("aten::copy_", "cudaMemcpyAsync", "aten::empty", "aten::empty_strided", "cudaEventRecordWithFlags",
           "cuLaunchKernelEx", "cudaLaunchKernel", "cudaGraphLaunch")


def small_graphs(engine: LLMEngine) -> tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]:
    """The engine's bs 1 and bs 2 decode graphs, the first captured by one short request."""
    engine.add_request("warm", list(range(10, 60)), SamplingParams(max_tokens=8, temperature=0.8, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    engine.runner.capture_graphs((2,))
    graphs = engine.runner.pool._graphs
    return graphs[1].native, graphs[2].native


def time_replays(graph: torch.cuda.CUDAGraph, other: torch.cuda.CUDAGraph) -> tuple[list[float], ...]:
    """Host seconds of each of REPLAYS replays on an idle GPU; the same of a replay queued behind the same graph's
    replay in flight, and of `other`'s behind `graph`'s; and [GPU ms a replay back to back]."""
    idle, behind, behind_other = [], [], []
    for _ in range(REPLAYS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        idle.append(time.perf_counter() - start)
        start = time.perf_counter()
        graph.replay()  # NOTE: the first still runs: async scheduling launches a step so
        behind.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        graph.replay()
        start = time.perf_counter()
        other.replay()
        behind_other.append(time.perf_counter() - start)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return idle, behind, behind_other, [begin.elapsed_time(end) / REPLAYS]


def replays_in_steps(engine: LLMEngine, steps: int = 100) -> list[float]:
    """Host seconds of the pool's replay call in each of `steps` decode steps of one sampled request."""
    engine.add_request("replays", list(range(10, 310)),
                       SamplingParams(max_tokens=steps + 30, temperature=0.8, ignore_eos=True))
    for _ in range(20):
        engine.step()
    with timed_parts(engine, (("replay", "capturer", "replay"),)) as times:
        for _ in range(steps):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    return times["replay"]


def api_calls(engine: LLMEngine) -> dict[str, float]:
    """Each COUNTED host call's count a decode step, over PROFILED_STEPS steps of one sampled request."""
    engine.add_request("profiled", list(range(10, 310)),
                       SamplingParams(max_tokens=80, temperature=0.8, ignore_eos=True))
    for _ in range(30):
        engine.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED_STEPS):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    return {e.key: e.count / PROFILED_STEPS for e in prof.key_averages() if e.key in COUNTED}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="random:smollm2-135m")
    p.add_argument("--switch", default="pdl", help="the kernel switch the second engine has off")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("replay_probe needs CUDA")
    names = (f"{args.switch} on", f"{args.switch} off")
    engines = (LLMEngine(EngineConfig(model=args.model)),
               LLMEngine(EngineConfig(model=args.model, disabled_kernels=(args.switch,))))
    graphs = [small_graphs(e) for e in engines]
    rows: list[list[list[float]]] = [[[], [], [], []], [[], [], [], []]]  # per engine: idle, behind, other, GPU
    for _ in range(args.rounds):
        for i, (graph, other) in enumerate(graphs):
            for column, values in zip(rows[i], time_replays(graph, other), strict=True):
                column += values
    in_steps = replays_in_steps(engines[0])
    calls = api_calls(engines[0])
    print(f"$ {' '.join(sys.argv)}")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.model}, bs 1 graph, "
          f"{args.rounds} rounds of {REPLAYS} replays")
    print("| engine | replay host us (idle GPU, p50) | behind its replay in flight | bs 2 behind bs 1 in flight | "
          "GPU ms a replay (back to back, p50) |\n|---|---|---|---|---|")
    for i, name in enumerate(names):
        idle, behind, other, gpu = rows[i]
        print(f"| {name} | {statistics.median(idle) * 1e6:.1f} | {statistics.median(behind) * 1e6:.1f} | "
              f"{statistics.median(other) * 1e6:.1f} | {statistics.median(gpu):.4f} |")
    q = statistics.quantiles(in_steps, n=10)
    print(f"\nThe pool's replay call in {len(in_steps)} decode steps of {names[0]}: host us p10 {q[0] * 1e6:.1f}, "
          f"p50 {statistics.median(in_steps) * 1e6:.1f}, p90 {q[-1] * 1e6:.1f}")
    print(f"\n| host call ({names[0]}, {PROFILED_STEPS} decode steps) | a step |\n|---|---|")
    for key in COUNTED:
        if key in calls:
            print(f"| {key} | {calls[key]:.2f} |")


if __name__ == "__main__":
    main()
