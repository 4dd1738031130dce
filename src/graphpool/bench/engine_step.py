"""`bench step`'s engine columns: the whole engine's decode step (scheduling, inputs, the pool's replay,
sampling, outputs) next to the bare graph replay, synchronous and with async scheduling (the target:
the engine's step <= 1.05x the replay alone at 1B bs 1).

Each size: `bs` requests of about `context_len` random tokens decode greedily over the step bench's own model (its
weights, a KV cache of the engine's own); the wall time of every `engine.step()` call that ran a pure decode
step of `bs` rows is kept, the first `warmup` of them dropped, the median reported. With async scheduling a
call returns the step launched before, so in a steady decode each call is one step.
"""

from __future__ import annotations

import random
import time
from typing import Any

from graphpool.bench.common import free_device_memory, median
from graphpool.bench.step_config import StepBenchConfig
from graphpool.model.config import ModelConfig


def engine_step_ms(model: Any, config: ModelConfig, bs: int, cfg: StepBenchConfig, async_scheduling: bool) -> float:
    """Median wall ms of the engine's decode steps at `bs` rows (graphs where the device has them)."""
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine
    from graphpool.engine.sampling_params import SamplingParams

    steps = cfg.warmup + cfg.reps
    # NOTE: the model covers context_len + 16 positions (the step bench built it): the prompt leaves room for
    # twice the timed steps, so requests admitted a few steps apart still decode together through them all
    prompt_len = max(1, cfg.context_len - 2 * steps - 16)
    max_tokens = max(1, min(2 * steps + 8, model.max_positions - prompt_len - 1))
    max_len = prompt_len + max_tokens + 1
    device = next(model.parameters()).device
    engine = LLMEngine(EngineConfig(
        model="bench-step", device=str(device), dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        max_model_len=max_len, block_size=cfg.block_size, num_kv_blocks=bs * -(-max_len // cfg.block_size) + 2,
        max_num_seqs=bs, enable_prefix_caching=False, enable_mixed_steps=False,
        graph_warmup=(bs,) if device.type == "cuda" else "none", async_scheduling=async_scheduling,
    ), loaded=(model, config, None))
    rng = random.Random(bs)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(bs):
        engine.add_request(f"s{i}", [rng.randrange(config.vocab_size) for _ in range(prompt_len)], params)
    walls: list[float] = []
    while engine.has_unfinished_requests() and len(walls) < steps:
        t = time.perf_counter()
        engine.step()
        ms = (time.perf_counter() - t) * 1e3
        info = engine.last_step
        if info is not None and info.kind == "decode" and info.batch_size == bs:
            walls.append(ms)
    del engine
    free_device_memory(device)
    return median(walls[cfg.warmup:]) if len(walls) > cfg.warmup else float("nan")
