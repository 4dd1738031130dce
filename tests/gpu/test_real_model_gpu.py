"""The real default model (SmolLM2-135M-Instruct GGUF) on the GPU against transformers on the same file.

float32: the engine's greedy tokens (decode through the graph pool) equal transformers' token for token.
bfloat16: teacher-forced top-1 agreement with the float32 reference, ours next to transformers' own bfloat16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import report, require

from graphpool import LLM, SamplingParams
from graphpool.model import AttentionMetadata, LlamaModel, load_model
from model_reference import PARITY_PROMPTS

PROMPTS = PARITY_PROMPTS
NEW_TOKENS = 32
MAX_MODEL_LEN = 256
BLOCK = 16


def _hf_model(path: Path, dtype: torch.dtype) -> Any:
    transformers = require("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    return model.to("cuda").eval()


@torch.inference_mode()
def _hf_decode(model: Any, prompt: list[int], n: int, forced: list[int] | None = None) -> list[int]:
    """transformers' own decode path (its KV cache): greedy, or teacher-forced on ``forced``; the top-1 token
    predicted at each of the ``n`` positions."""
    out = model(torch.tensor([prompt], device="cuda"), use_cache=True)
    preds = [int(out.logits[0, -1].argmax())]
    for i in range(n - 1):
        feed = preds[-1] if forced is None else forced[i]
        out = model(torch.tensor([[feed]], device="cuda"), past_key_values=out.past_key_values, use_cache=True)
        preds.append(int(out.logits[0, -1].argmax()))
    return preds


@torch.inference_mode()
def _ours_teacher_forced(model: LlamaModel, prompt: list[int], forced: list[int]) -> list[int]:
    """Our prefill + paged decode (the engine's kernels), fed ``forced``; the top-1 token at each position."""
    dev = model.device
    n = len(forced)
    blocks = -(-(len(prompt) + n) // BLOCK)
    kv = model.allocate_kv_caches(1 + blocks, BLOCK)
    table = torch.arange(1, 1 + blocks, device=dev, dtype=torch.int32)[None, :]

    def slots(pos: torch.Tensor) -> torch.Tensor:
        return table[0].long()[pos // BLOCK] * BLOCK + pos % BLOCK

    positions = torch.arange(len(prompt), device=dev)
    meta = AttentionMetadata(True, positions, slots(positions), seq_lens=[len(prompt)])
    hidden = model(torch.tensor(prompt, device=dev), meta, kv)
    preds = [int(model.compute_logits(hidden[-1:]).argmax(-1))]
    for i in range(n - 1):
        pos = torch.tensor([len(prompt) + i], device=dev)
        meta = AttentionMetadata(
            False, pos, slots(pos), block_tables=table, context_lens=(pos + 1).to(torch.int32),
            max_len_bound=MAX_MODEL_LEN,
        )
        logits = model.compute_logits(model(torch.tensor([forced[i]], device=dev), meta, kv))
        preds.append(int(logits.argmax(-1)))
    return preds


@pytest.fixture(scope="module")
def fp32_reference(default_gguf: Path) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, transformers float32 greedy continuations) on the GPU; TF32 stays off."""
    assert not torch.backends.cuda.matmul.allow_tf32
    _, _, tokenizer = load_model(None, "cpu", torch.float32, "torch", max_positions=8)
    assert tokenizer is not None
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    hf = _hf_model(default_gguf, torch.float32)
    refs = [_hf_decode(hf, p, NEW_TOKENS) for p in prompts]
    del hf
    torch.cuda.empty_cache()
    return prompts, refs


def test_float32_greedy_equals_transformers_token_for_token(fp32_reference) -> None:
    prompts, refs = fp32_reference
    llm = LLM(device="cuda", dtype="float32", max_model_len=MAX_MODEL_LEN, num_kv_blocks=256)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.graph_stats()
    assert stats is not None and stats.hits + stats.padded_hits > 0, stats  # decode replayed graphs
    got = [o.token_ids for o in outs]
    equal = sum(g == r for g, r in zip(got, refs, strict=True))
    report("fp32_greedy_sequences_equal", f"{equal}/{len(refs)} prompts x {NEW_TOKENS} tokens")
    for i, (g, r) in enumerate(zip(got, refs, strict=True)):
        assert g == r, (PROMPTS[i], g, r)


def test_bfloat16_teacher_forced_agreement_no_worse_than_transformers(default_gguf: Path, fp32_reference) -> None:
    prompts, refs = fp32_reference
    ours = load_model(None, "cuda", torch.bfloat16, "triton", max_positions=MAX_MODEL_LEN)[0]
    assert ours.attn_backend == "triton"
    ours_preds = [_ours_teacher_forced(ours, p, r) for p, r in zip(prompts, refs, strict=True)]
    del ours
    hf = _hf_model(default_gguf, torch.bfloat16)
    hf_preds = [_hf_decode(hf, p, NEW_TOKENS, forced=r) for p, r in zip(prompts, refs, strict=True)]
    total = len(refs) * NEW_TOKENS

    def agree(preds: list[list[int]]) -> float:
        return sum(a == b for pr, rf in zip(preds, refs, strict=True) for a, b in zip(pr, rf, strict=True)) / total

    a_ours, a_hf = agree(ours_preds), agree(hf_preds)
    report("bf16_top1_agreement", {"graphpool": a_ours, "transformers": a_hf, "positions": total})
    assert a_ours > 0.8, a_ours  # a broken bf16 path lands far below
    # NOTE: ours no worse than transformers' bf16, within one position of 256 (a single bf16 near-tie).
    assert a_ours >= a_hf - 1 / total, (a_ours, a_hf)
