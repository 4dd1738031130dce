"""GPU tests never skip for a missing dependency or model where CUDA is present: they fail with the reason.

NOTE: a test that skipped itself for a missing package or model would let a server that crashes on the GPU
look green. On a machine without CUDA the collection hook in tests/conftest.py skips everything here before
these fixtures run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_helpers import SETUP_HINT

from toy import ToyDecode


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The embedded default model's GGUF file, or a failure that says how to install it."""
    from graphpool.model.gguf_loader import default_gguf_path

    try:
        return default_gguf_path()
    except FileNotFoundError as e:
        pytest.fail(f"the default model is missing ({e}); {SETUP_HINT}", pytrace=False)


@pytest.fixture(scope="module")
def small() -> ToyDecode:
    """A tiny toy decode step (float32): pool mechanics, bit-exact comparisons."""
    return ToyDecode(vocab=512, hidden=64, layers=1, slots=512, dtype=torch.float32, device=torch.device("cuda"))


@pytest.fixture(scope="module")
def big() -> ToyDecode:
    """bs=256: [256, 8192] bf16 activations and [256, 32000] logits: MiB-sized graph footprints."""
    return ToyDecode(vocab=32000, hidden=2048, layers=2, slots=1024, dtype=torch.bfloat16,
                     device=torch.device("cuda"))
