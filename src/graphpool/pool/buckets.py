"""The bucket ladder: the batch sizes that get a graph, and padding a live batch up to one of them."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator


class BucketLadder:
    """Sorted, distinct graph batch sizes. A live batch of ``bs`` rows runs in the smallest size >= bs."""

    __slots__ = ("_sizes",)

    def __init__(self, sizes: Iterable[int]) -> None:
        sizes = tuple(sizes)
        if not sizes:
            raise ValueError("bucket ladder: the list of batch sizes is empty")
        for s in sizes:
            if not isinstance(s, int) or isinstance(s, bool) or s < 1:
                raise ValueError(f"bucket ladder: every batch size must be an int >= 1, got {s!r}")
        if any(a >= b for a, b in itertools.pairwise(sizes)):
            raise ValueError(f"bucket ladder: batch sizes must be strictly increasing (sorted, no duplicates): {sizes}")
        self._sizes = sizes

    @classmethod
    def build(cls, max_batch_size: int, split_batch_size: int, grow_step: int) -> BucketLadder:
        """Sizes ``1..split``, then every ``grow_step`` up to ``max``, plus ``max`` itself."""
        if max_batch_size < 1 or split_batch_size < 1 or grow_step < 1:
            raise ValueError(
                "bucket ladder: max_batch_size, split_batch_size and grow_step must be >= 1, got "
                f"{max_batch_size}, {split_batch_size}, {grow_step}"
            )
        if split_batch_size > max_batch_size:
            raise ValueError(
                f"bucket ladder: split_batch_size ({split_batch_size}) > max_batch_size ({max_batch_size})"
            )
        sizes = list(range(1, split_batch_size + 1))
        s = split_batch_size + grow_step
        while s < max_batch_size:
            sizes.append(s)
            s += grow_step
        if sizes[-1] != max_batch_size:
            sizes.append(max_batch_size)
        return cls(sizes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def max_size(self) -> int:
        return self._sizes[-1]

    def find_closest(self, batch_size: int) -> int | None:
        """The smallest ladder size >= ``batch_size``; None above the largest size."""
        i = bisect.bisect_left(self._sizes, batch_size)
        return self._sizes[i] if i < len(self._sizes) else None

    def padding_cover(self, max_padding_ratio: float) -> list[int]:
        """Largest-first sizes such that every ladder size b has a chosen s with b <= s <= b*(1+ratio).

        A small resident set that a padded-serving miss policy can use for every batch size.
        """
        chosen = [self._sizes[-1]]
        while True:
            s = chosen[-1]
            # s serves every b >= s / (1 + ratio); the next pick is the largest size below that range.
            lo = s / (1.0 + max_padding_ratio)
            i = bisect.bisect_left(self._sizes, lo)
            if i == 0:
                return chosen
            # NOTE: lo <= s, so sizes[i - 1] < s: the loop always moves down.
            chosen.append(self._sizes[i - 1])

    def __contains__(self, size: object) -> bool:
        if not isinstance(size, int):
            return False
        i = bisect.bisect_left(self._sizes, size)
        return i < len(self._sizes) and self._sizes[i] == size

    def __iter__(self) -> Iterator[int]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def __repr__(self) -> str:
        return f"BucketLadder({list(self._sizes)})"
