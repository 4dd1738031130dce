"""Host bytes that a copy to the device reads without waiting for the stream: pinned on CUDA, each with the event
after the copy that last read it, so a writer reuses a buffer only once that copy ran (`busy`), and replaces a
busy one rather than waiting (torch's pinned allocator keeps the old one until its copy is done). The pool's
static-input mirrors and the engine's `HostStaging` use them in turn."""

from __future__ import annotations

import torch

from graphpool.pool.cuda_state import _index


def record_event(event: torch.cuda.Event, device: torch.device) -> None:
    """``event.record()`` on ``device``'s current stream. A plain ``record()`` finds the current device through a
    chain of Python calls that reads an environment variable: most of a record's host time, once per step."""
    event.record(torch.cuda.current_stream(_index(device)))


class PinnedBuffer:
    """``nbytes`` host bytes (pinned where `pin`) and the event recorded after the copy out of them (`sent`)."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.bytes = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self._copied = torch.cuda.Event() if pin else None  # NOTE: never recorded: query() is True

    def busy(self) -> bool:
        """Whether the last copy out of these bytes is still queued (writing them now would change its data)."""
        return self._copied is not None and not self._copied.query()

    def sent(self, device: torch.device) -> None:
        """Call once the copy out of these bytes to `device` is enqueued (its current stream)."""
        if self._copied is not None:
            record_event(self._copied, device)
