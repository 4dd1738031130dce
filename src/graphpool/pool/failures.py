"""Why a capture failed: out of memory, a capture CUDA invalidated, or an error of the step itself.

Every failed capture falls back to eager (the request still completes) and blocks its size. The kind only
decides how loudly it is reported: ``oom`` and ``capture_invalidated`` are operational (a warning), ``error``
is a bug in the step that only shows under capture, such as a host sync or ``.item()`` (an ERROR with its
traceback, once per distinct error).
"""

from __future__ import annotations

import enum
import logging

import torch


class CaptureFailureKind(str, enum.Enum):
    OOM = "oom"  # the allocator or the driver ran out of memory during warm-up, capture or instantiation
    CAPTURE_INVALIDATED = "capture_invalidated"  # CUDA ended the capture though the step returned normally
    ERROR = "error"  # the step raised under capture (host sync, .item(), ...) or anything else


# NOTE: torch 2.11 raises "CUDA error: <cudaGetErrorString>" (a RuntimeError); its own refusals read as below.
_OOM_MARKERS = ("out of memory", "cudaErrorMemoryAllocation")
_CAPTURE_MARKERS = (
    "operation failed due to a previous error during capture",  # cudaErrorStreamCaptureInvalidated
    "operation not permitted when stream is capturing",  # cudaErrorStreamCaptureUnsupported
    "operation would result in a merge of separate capture sequences",  # cudaErrorStreamCaptureMerge
    "capture was not initiated in this stream",  # cudaErrorStreamCaptureUnmatched
    "capturing stream has unjoined work",  # cudaErrorStreamCaptureUnjoined
    "dependency created on uncaptured work in another stream",  # cudaErrorStreamCaptureIsolation
    "operation would make the legacy stream depend on a capturing blocking stream",  # ...CaptureImplicit
    "operation not permitted on an event last recorded in a capturing stream",  # cudaErrorCapturedEvent
    "attempt to terminate a thread-local capture sequence from another thread",  # ...CaptureWrongThread
    "cudaErrorStreamCapture",
    "during CUDA graph capture",
    "captures_underway",
)


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or any(m in str(exc) for m in _OOM_MARKERS)


def is_capture_invalidation(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _CAPTURE_MARKERS)


def classify(exc: BaseException, *, raised_by_step: bool) -> CaptureFailureKind:
    """``raised_by_step``: the step itself raised while being captured (rather than ``capture_end``, the
    instantiation, or the capturer around it). A capture-status error the step raises is the step's own
    host sync: a bug, reported as ``error``."""
    if is_oom(exc):
        return CaptureFailureKind.OOM
    if not raised_by_step and is_capture_invalidation(exc):
        return CaptureFailureKind.CAPTURE_INVALIDATED
    return CaptureFailureKind.ERROR


class CaptureError(RuntimeError):
    """Raised by a capturer after it cleaned up a failed capture; ``cause`` is the error that made it fail."""

    def __init__(self, kind: CaptureFailureKind, size: int, cause: BaseException) -> None:
        super().__init__(f"capture of bs={size} failed ({kind.value}): {type(cause).__name__}: {cause}")
        self.kind = kind
        self.size = size
        self.cause = cause


class CaptureFailureLog:
    """Logs a failed capture: a warning for ``oom`` / ``capture_invalidated``; an ERROR for ``error``, with
    the traceback the first time an error is seen (then one line per further size it fails)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._seen: set[str] = set()

    def note(self, size: int, e: CaptureError) -> None:
        cause = e.cause
        what = f"{type(cause).__name__}: {cause}"
        if e.kind is not CaptureFailureKind.ERROR:
            self.logger.warning("graph pool: capture of bs=%d failed (%s, %s); it will run eagerly", size, e.kind.value, what)
        elif what not in self._seen:
            self._seen.add(what)
            self.logger.error(
                "graph pool: capture of bs=%d failed with an error that is neither out-of-memory nor an "
                "invalidated capture (%s); bs=%d runs eagerly from now on. A host sync or .item() in the step "
                "is the usual cause.",
                size, what, size, exc_info=(type(cause), cause, cause.__traceback__),
            )
        else:
            self.logger.error("graph pool: capture of bs=%d failed with the error logged above (%s); it will run eagerly", size, what)
