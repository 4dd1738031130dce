"""Step times while a decode runs next to a long prompt that chunked prefill splits (eager chunks in strict
interleaving: no graph prefill, no mixed steps), on the default model.

    python benchmarks/chunked_prefill_steps.py [--device cuda] [--dtype bfloat16] [--budgets 0 64 128]

Per budget (--max-num-batched-tokens; 0: the engine's default): a short request decodes 5 steps, then a
prompt of --long tokens arrives; every step until its first token is timed (synchronised), by kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model
from graphpool.model.ops import default_attn_backend

PROMPT = ("You are a careful assistant. The user asks about the history of science: astronomy, medicine, printing, "
          "navigation and the instruments that made each possible, from the astrolabe to the microscope. ")


def step_times(engine: LLMEngine, short: list[int], long: list[int], device: torch.device) -> dict[str, list[float]]:
    """ms of every step from the long prompt's arrival to its first token, by step kind."""
    engine.add_request("short", short, SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True))
    for _ in range(5):
        engine.step()
    engine.add_request("long", long, SamplingParams(temperature=0, max_tokens=1))
    times: dict[str, list[float]] = {}
    done = False
    while not done:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        done = any(o.request_id == "long" for o in engine.step())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.setdefault(engine.last_step.kind, []).append((time.perf_counter() - t) * 1e3)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--budgets", type=int, nargs="+", default=[0, 64, 128])
    p.add_argument("--long", type=int, default=500, help="tokens of the long prompt")
    args = p.parse_args(argv)
    base = EngineConfig(device=args.device, dtype=args.dtype, max_model_len=args.long + 12, num_kv_blocks=256,
                        graph_prefill_max_tokens=0, enable_mixed_steps=False)
    device = base.torch_device
    loaded = load_model(None, device, base.torch_dtype, default_attn_backend("auto", device),
                        max_positions=base.max_model_len)
    tokenizer = loaded[2]
    assert tokenizer is not None  # the default model carries its tokenizer
    ids = tokenizer.encode(PROMPT)
    long = (ids * (args.long // len(ids) + 1))[: args.long]
    print(f"{device}, {base.torch_dtype}, a {args.long}-token prompt next to one decode; ms per step")
    for budget in args.budgets:
        engine = LLMEngine(dataclasses.replace(base, max_num_batched_tokens=budget or None), loaded=loaded)
        times = step_times(engine, ids[:20], long, device)
        row = ", ".join(f"{kind} x{len(ms)}: median {statistics.median(ms):.2f}, max {max(ms):.2f}"
                        for kind, ms in sorted(times.items()))
        print(f"budget {budget or 'default'}: {row}")


if __name__ == "__main__":
    main()
