"""Prompt logprobs on the GPU (default model, Triton kernels, real CUDA graphs, async scheduling on): float32
values equal transformers' log_softmax over the whole prompt whether the prompt rows come from an eager
(varlen / paged) prefill or from decode-graph replays (graph prefill, mixed steps), beside requests that do
not ask, with prefix caching on; decode steps still replay graphs and greedy tokens are those of a run that
asks nothing. In bfloat16 the graph path's values stay within bf16 rounding of the eager prefill's."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report
from test_prefix_chunked_gpu import MAX_MODEL_LEN, prompts  # noqa: F401 (a fixture)

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine, RequestOutput, StepInfo
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.loader import load_model

BASE = {"device": "cuda", "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": 256}
SETTINGS = {
    "eager": {"graph_prefill_max_tokens": 0, "enable_mixed_steps": False, "max_num_batched_tokens": 96},
    "graphs": {"graph_prefill_max_tokens": 64, "max_num_batched_tokens": 64},  # mixed steps on (the default)
}
TOL = 2e-3
ASKS = (0, 2, 4)  # the prompts that ask (k = 5); the others ask nothing


def _run(engine: LLMEngine, prompt_ids: list[list[int]], asks: tuple[int, ...] = ASKS
         ) -> tuple[dict[int, RequestOutput], list[StepInfo]]:
    for i, p in enumerate(prompt_ids):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                     prompt_logprobs=5 if i in asks else None))
    done: dict[int, RequestOutput] = {}
    steps: list[StepInfo] = []
    while engine.has_unfinished_requests():
        done.update({int(o.request_id): o for o in engine.step() if o.finished})
        if engine.last_step is not None:
            steps.append(engine.last_step)
    return done, steps


@pytest.fixture(scope="module")
def reference(prompts, hf_default_model) -> dict[int, torch.Tensor]:  # noqa: F811
    """transformers' float32 log_softmax at prompt positions 0 .. n-2 (on the CPU)."""
    out = {}
    with torch.no_grad():
        for i in ASKS:
            logits = hf_default_model(input_ids=torch.tensor([prompts[i]])).logits[0].float()
            out[i] = torch.log_softmax(logits[:-1], dim=-1)
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
def test_float32_prompt_logprobs_equal_transformers(prompts, reference, name: str) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.float32, "triton", max_positions=MAX_MODEL_LEN)
    base = BASE | {"dtype": "float32", "enable_prefix_caching": True}
    plain, _ = _run(LLMEngine(EngineConfig(**base), loaded=loaded), prompts, asks=())
    engine = LLMEngine(EngineConfig(**base, **SETTINGS[name]), loaded=loaded)
    done, steps = _run(engine, prompts)
    worst = 0.0
    for i, out in done.items():
        assert out.token_ids == plain[i].token_ids
        if i not in ASKS:
            assert out.prompt_logprobs is None
            continue
        ref, lps = reference[i], out.prompt_logprobs
        assert lps is not None and [lp.token_id for lp in lps] == prompts[i][1:]
        got = torch.tensor([lp.logprob for lp in lps])
        want = ref[torch.arange(len(lps)), torch.tensor(prompts[i][1:])]
        worst = max(worst, (got - want).abs().max().item())
        tops = torch.tensor([[v for _, v in lp.top] for lp in lps])
        assert torch.allclose(tops[:, 0], ref.max(dim=-1).values, atol=TOL)
    report(f"prompt_logprobs_gpu fp32 {name}: max |logprob - transformers'|", f"{worst:.2e}")
    assert worst < TOL
    # the repeated prompts were scored whole (no cached prefix for them), the others hit the cache
    assert engine.prefix_cache_stats().hits_tokens > 0
    decode = [s for s in steps if s.kind == "decode"]
    report(f"prompt_logprobs_gpu fp32 {name}: decode steps replayed", f"{sum(s.graph for s in decode)}/{len(decode)}")
    assert decode and all(s.graph for s in decode)  # decode steps still replay their graphs
    if name == "graphs":
        assert any(s.graph for s in steps if s.kind in ("prefill", "mixed"))


def test_bfloat16_graph_rows_match_the_eager_prefill(prompts) -> None:  # noqa: F811
    loaded = load_model(None, "cuda", torch.bfloat16, "triton", max_positions=MAX_MODEL_LEN)
    runs = {name: _run(LLMEngine(EngineConfig(**BASE, **kw, enable_prefix_caching=False), loaded=loaded), prompts)
            for name, kw in SETTINGS.items()}
    worst = 0.0
    for i in ASKS:
        a, b = (runs[name][0][i].prompt_logprobs for name in SETTINGS)
        assert a is not None and b is not None and len(a) == len(b) == len(prompts[i]) - 1
        worst = max(worst, max(abs(x.logprob - y.logprob) for x, y in zip(a, b, strict=True)))
    report("prompt_logprobs_gpu bf16: max |graph rows - eager prefill|", f"{worst:.3f}")
    assert worst < 0.25
    assert any(s.graph for s in runs["graphs"][1] if s.kind in ("prefill", "mixed"))
    assert any(s.graph for s in runs["graphs"][1] if s.kind == "decode")
