"""Missing chunk indexes as half-open ranges: what a resuming client still has to send."""

from __future__ import annotations

from collections.abc import Iterable


def missing_ranges(total_chunks: int, received: Iterable[int]) -> list[tuple[int, int]]:
    """Half-open `[start, end)` ranges of indexes in `0..total_chunks-1` not in `received`.

    Indexes outside the range are ignored; the result is sorted and maximal (adjacent
    missing indexes form one range).
    """
    have = sorted({i for i in received if 0 <= i < total_chunks})
    ranges: list[tuple[int, int]] = []
    expected = 0
    for index in have:
        if index > expected:
            ranges.append((expected, index))
        expected = index + 1
    if expected < total_chunks:
        ranges.append((expected, total_chunks))
    return ranges


def count_in(ranges: Iterable[tuple[int, int]]) -> int:
    """How many indexes the ranges cover."""
    return sum(end - start for start, end in ranges)
