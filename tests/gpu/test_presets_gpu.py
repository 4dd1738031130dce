"""The newer families' random presets at their full published shapes on one GPU (bfloat16): the step bench's graph
replay equals its eager step (what `graphpool bench step --models NAME` runs), and `serve --model random:NAME`
answers a completion through replayed decode graphs."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from graphpool.bench.step import StepBenchConfig, run_step_bench
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.model.presets import PRESETS
from graphpool.server.main import serve_in_thread

NAMES = ("qwen3-8b", "gemma2-2b", "gemma3-1b", "phi3-mini-4k")
CONTEXT = 256  # below every preset's sliding window (gemma3-1b's 512)


@pytest.mark.parametrize("name", NAMES)
def test_step_bench_runs_the_preset_and_its_graph_equals_eager(name: str, tmp_path: Path) -> None:
    cfg = StepBenchConfig(models=(name,), batch_sizes=(1, 8), compile_sizes=(), context_len=CONTEXT, warmup=2, reps=5,
                          engine_sizes=(1,))
    rows = run_step_bench(cfg, tmp_path, ["test"])["rows"]
    assert [r.batch_size for r in rows] == [1, 8]
    for r in rows:
        assert r.graph_rel_err < 1e-3, (name, r.batch_size, r.graph_rel_err)  # the same kernels, the same inputs
        for v in (r.eager_ms, r.graph_ms, r.pool_ms, r.floor_ms):
            assert math.isfinite(v) and v > 0
    assert math.isfinite(rows[0].engine_ms) and rows[0].engine_ms > 0


@pytest.mark.parametrize("name", NAMES)
def test_serve_random_preset_answers_through_graphs(name: str) -> None:
    config = EngineConfig(model=f"random:{name}", device="cuda", max_model_len=CONTEXT, num_kv_blocks=64,
                          max_num_seqs=8, graph_max_batch_size=8, graph_warmup="none")
    engine = LLMEngine(config)
    try:
        with serve_in_thread(engine) as (url, _):
            body = {"model": f"random:{name}", "prompt": [[3, 5, 7, 11], [13, 17]], "max_tokens": 8,
                    "temperature": 0, "ignore_eos": True}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            choices = r.json()["choices"]
            assert len(choices) == 2 and all(c["finish_reason"] == "length" for c in choices)
            assert r.json()["usage"]["completion_tokens"] == 16
        stats = engine.graph_stats()
        assert stats is not None and stats.captures >= 1 and stats.hits + stats.padded_hits > 0, stats
        assert engine.model_config.vocab_size == PRESETS[name].vocab_size
    finally:
        engine.close()
