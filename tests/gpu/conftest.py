"""GPU tests never skip for a missing dependency or model where CUDA is present: they fail with the reason.

NOTE: the server GPU test once skipped itself on the device machine (no fastapi/openai, no default model
there), so a server that crashed on the GPU looked green. On a machine without CUDA the collection hook in
tests/conftest.py skips everything here before these fixtures run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_helpers import SETUP_HINT


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The embedded default model's GGUF file, or a failure that says how to install it."""
    from graphpool.model.gguf_loader import default_gguf_path

    try:
        return default_gguf_path()
    except FileNotFoundError as e:
        pytest.fail(f"the default model is missing ({e}); {SETUP_HINT}", pytrace=False)
