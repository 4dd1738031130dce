"""Failed captures on CPU: classified by kind, logged by kind, counted in PoolStats and /metrics; the request
still completes eagerly; an error of the eager warm-up is the step's own and propagates."""

from __future__ import annotations

import logging

import pytest
import torch

from graphpool.pool import CaptureFailureKind, FallbackReason, GraphPool, InputSpec, PoolConfig
from graphpool.pool.failures import classify
from graphpool.pool.testing import EagerCapturer
from graphpool.server.metrics import EngineCollector

SPECS = (InputSpec("x", (3,), torch.float32, 0.0),)
POOL_LOGGER = "graphpool.pool.pool"
SYNC_ERROR = "CUDA error: operation not permitted when stream is capturing"
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


def batch(bs: int, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(bs, 3, generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize(
    ("exc", "by_step", "kind"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"), True, CaptureFailureKind.OOM),
        (RuntimeError("CUDA error: out of memory"), False, CaptureFailureKind.OOM),
        (RuntimeError(INVALIDATED), False, CaptureFailureKind.CAPTURE_INVALIDATED),
        (RuntimeError(SYNC_ERROR), False, CaptureFailureKind.CAPTURE_INVALIDATED),
        (RuntimeError(SYNC_ERROR), True, CaptureFailureKind.ERROR),  # the step's own host sync: a bug
        (RuntimeError("Expected captures_underway.empty() to be true"), False, CaptureFailureKind.CAPTURE_INVALIDATED),
        (RuntimeError("shape mismatch"), False, CaptureFailureKind.ERROR),
        (ValueError(INVALIDATED), False, CaptureFailureKind.ERROR),  # not a torch/CUDA error
    ],
)
def test_classify(exc: BaseException, by_step: bool, kind: CaptureFailureKind) -> None:
    assert classify(exc, raised_by_step=by_step) is kind


def test_step_error_under_capture_completes_eagerly_logs_error_once_and_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cap = EagerCapturer()

    def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        if cap.capturing and s["x"].shape[0] in (4, 8):
            raise RuntimeError(SYNC_ERROR)  # what torch raises for a .item() / synchronize() under capture
        return s["x"] * 2

    pool = GraphPool(step, SPECS, PoolConfig(miss_policy="capture"), device="cpu", capturer=cap)
    with caplog.at_level(logging.WARNING, logger=POOL_LOGGER):
        for bs in (4, 4, 8, 2):
            b = batch(bs, seed=bs)
            assert torch.equal(pool.run(b), b["x"] * 2)  # every request completes
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert errors[0].exc_info is not None and "bs=4" in errors[0].getMessage()
    assert SYNC_ERROR in errors[0].getMessage()
    assert errors[1].exc_info is None and "logged above" in errors[1].getMessage()  # traceback once
    st = pool.stats()
    assert st.capture_failures == 2 and st.capture_failures_by_kind == {"error": 2}
    assert st.fallbacks == {FallbackReason.CAPTURE_FAILED: 3} and st.resident_sizes == (2,)
    assert st.as_dict()["capture_failures_by_kind"] == {"error": 2}


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (torch.OutOfMemoryError, "oom"),
        (lambda msg: RuntimeError(f"{INVALIDATED} ({msg})"), "capture_invalidated"),
    ],
)
def test_operational_failures_are_warnings(caplog: pytest.LogCaptureFixture, error: object, kind: str) -> None:
    cap = EagerCapturer(fail_sizes={3}, error=error)  # type: ignore[arg-type]
    pool = GraphPool(lambda s: s["x"] + 1, SPECS, PoolConfig(miss_policy="capture"), device="cpu", capturer=cap)
    with caplog.at_level(logging.WARNING, logger=POOL_LOGGER):
        b = batch(3)
        assert torch.equal(pool.run(b), b["x"] + 1)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and f"({kind}," in record.getMessage() and record.exc_info is None
    assert pool.stats().capture_failures_by_kind == {kind: 1}


def test_error_in_eager_warmup_propagates_and_is_no_capture_failure() -> None:
    def step(s: dict[str, torch.Tensor]) -> torch.Tensor:
        if s["x"].shape[0] == 5:
            raise ValueError("bad step")
        return s["x"]

    pool = GraphPool(step, SPECS, PoolConfig(miss_policy="capture"), device="cpu", capturer=EagerCapturer())
    with pytest.raises(ValueError, match="bad step"):
        pool.run(batch(5))
    st = pool.stats()
    assert st.capture_failures == 0 and st.capture_failures_by_kind == {}
    pool.run(batch(6))
    assert pool.stats().resident_sizes == (6,)


def test_metrics_expose_failures_by_kind() -> None:
    cap = EagerCapturer(fail_sizes={1, 2}, error=torch.OutOfMemoryError)
    pool = GraphPool(lambda s: s["x"], SPECS, PoolConfig(miss_policy="capture"), device="cpu", capturer=cap)
    pool.run(batch(1))
    pool.run(batch(2))
    cap.fail_sizes = {3}
    cap.error = RuntimeError
    pool.run(batch(3))
    families = {m.name: m for m in EngineCollector._pool(pool.stats())}
    samples = {(s.name, s.labels.get("kind")): s.value for s in families["graphpool_graph_capture_failures_by_kind"].samples}
    assert samples == {
        ("graphpool_graph_capture_failures_by_kind_total", "error"): 1,
        ("graphpool_graph_capture_failures_by_kind_total", "oom"): 2,
    }
