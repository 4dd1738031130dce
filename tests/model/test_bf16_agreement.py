"""Every family in bf16 on the CPU, teacher-forced: graphpool's next-token logits (prefill rows, then decode
steps through the graph path's stand-in capturer) are no further from transformers' float32 logits than
transformers' own bf16 logits are (tests/bf16_agreement.py has the criteria and why); float32 equals it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bf16_agreement import FAMILIES, ROUTED, agreement, check_agreement, hf_logits, teacher_forced_logits
from graphpool.model import load_model
from graphpool.pool.testing import EagerCapturer
from model_reference import tiny_hf_model

PROMPT, LENGTH = 40, 96  # within every test model's sliding window (128 for the Gemmas)


@pytest.mark.parametrize("kind", FAMILIES + ROUTED)
def test_bf16_teacher_forced_no_worse_than_transformers_bf16(kind: str, tmp_path: Path) -> None:
    hf = tiny_hf_model(kind, tied=kind.startswith("gemma"))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    seqs = torch.randint(3, 300, (4, LENGTH), generator=torch.Generator().manual_seed(5)).tolist()
    ref, theirs = hf_logits(hf, seqs, torch.float32), hf_logits(hf, seqs, torch.bfloat16)
    model, _, _ = load_model(tmp_path, dtype=torch.bfloat16, max_positions=128)
    ours, stats = teacher_forced_logits(model, seqs, PROMPT, capturer=EagerCapturer())
    assert stats.hits > 0  # decode steps replayed (the stand-in's) graphs
    check_agreement(ours, theirs, ref, routed=kind in ROUTED)
    exact, _ = teacher_forced_logits(load_model(tmp_path, dtype=torch.float32, max_positions=128)[0], seqs, PROMPT,
                                     capturer=EagerCapturer())
    assert agreement(exact, ref).argmax == 1.0
    torch.testing.assert_close(exact, ref, atol=1e-4, rtol=1e-4)
