"""Per-request sampling parameters (the vLLM-style `SamplingParams`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature 0 is greedy (exact argmax); top_k 0 and top_p 1.0 switch those filters off. `seed` gives the
    request its own random stream, so its output does not depend on what else is in the batch. `stop` strings
    end generation with the text truncated before the stop string; `stop_token_ids` (and the model's EOS unless
    `ignore_eos`) end it with the token kept in `token_ids` but not in the text.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise ValueError(f"top_p must be a number, got {self.top_p!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.stop is not None:
            if isinstance(self.stop, str):
                object.__setattr__(self, "stop", [self.stop])
            stops = list(self.stop)  # type: ignore[arg-type]
            if not all(isinstance(s, str) and s for s in stops):
                raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
            object.__setattr__(self, "stop", stops)
        if self.stop_token_ids is not None:
            ids = list(self.stop_token_ids)
            if not all(_is_int(t) and t >= 0 for t in ids):
                raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
            object.__setattr__(self, "stop_token_ids", ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0) if self.stop else 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
