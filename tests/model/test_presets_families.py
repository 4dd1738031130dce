"""The newer families' random presets: their parameter counts equal the published models' (counted on the meta
device, no memory), and each decodes through the engine on the CPU at one layer (`?layers=1`)."""

from __future__ import annotations

import pytest
import torch

from graphpool import LLM, SamplingParams
from graphpool.model.families import build_model
from graphpool.model.loader import model_source
from graphpool.model.presets import PRESETS
from model_reference import paged_greedy

# Published totals: Qwen3-8B's model card (8.2B); Gemma 2's report (2,024,517,888 non-embedding parameters of
# the 2B, plus the 256,000 x 2,304 embedding of its Hugging Face checkpoint); Gemma 3's report (1B);
# Phi-3's report and model card (3.8B).
PUBLISHED = {
    "qwen3-8b": 8.2e9,
    "gemma2-2b": 2_024_517_888 + 256_000 * 2304,
    "gemma3-1b": 1.0e9,
    "phi3-mini-4k": 3.8e9,
}
FAMILY = {"qwen3-8b": "qwen3", "gemma2-2b": "gemma2", "gemma3-1b": "gemma3", "phi3-mini-4k": "llama"}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_matches_the_published_model(name: str) -> None:
    config = PRESETS[name]
    assert config.family == FAMILY[name]
    positions = min(config.max_position_embeddings, config.sliding_window or config.max_position_embeddings)
    model = build_model(config, device="meta", dtype=torch.bfloat16, max_positions=positions)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.01, f"{name}: {count:,} parameters"


def test_gemma3_preset_keeps_its_layer_pattern_when_cut() -> None:
    full = PRESETS["gemma3-1b"]
    # every sixth layer attends globally, the others over the sliding window
    assert [i for i in range(full.num_layers) if i not in full.local_layers] == [5, 11, 17, 23]
    cut = model_source("random:gemma3-1b?layers=7")
    assert cut.num_layers == 7 and cut.local_layers == cut.sliding_layers == (0, 1, 2, 3, 4, 6)
    assert model_source("random:gemma3-1b?layers=1").sliding_layers == (0,)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_decodes_through_the_engine_on_cpu(name: str) -> None:
    # bfloat16: one layer of qwen3-8b still holds two 151,936-row embeddings (3 GB in float32)
    llm = LLM(model=f"random:{name}?layers=1", device="cpu", dtype="bfloat16", max_model_len=64, num_kv_blocks=16,
              max_num_seqs=2)
    prompt = [5, 17, 300, 4000 % llm.engine.model_config.vocab_size]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    assert all(0 <= t < PRESETS[name].vocab_size for t in out.token_ids)
    # the engine's scheduled steps give what the model's own paged greedy loop gives
    assert out.token_ids == paged_greedy(llm.engine.model, [prompt], 4)[0]
