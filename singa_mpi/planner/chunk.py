"""How n items are cut into parts: the one rule every partitioned axis follows.

The first ``n % parts`` parts get one extra item (as in Heat's ``chunk``), so
uneven batches and feature counts are allowed and every rank can compute any
other rank's part without communication.
"""
from __future__ import annotations


def chunk(n: int, parts: int, part: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``part`` when ``n`` items are cut into ``parts`` parts."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} not in 0..{parts - 1}")
    base, extra = divmod(n, parts)
    lo = part * base + min(part, extra)
    return lo, lo + base + (1 if part < extra else 0)


def chunks(n: int, parts: int) -> list[tuple[int, int]]:
    return [chunk(n, parts, p) for p in range(parts)]

