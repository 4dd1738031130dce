from __future__ import annotations

from pathlib import Path

import pytest
import torch

GPU_DIR = Path(__file__).parent / "gpu"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        # NOTE: everything under tests/gpu is a GPU test whether or not it carries the marker itself.
        if GPU_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
