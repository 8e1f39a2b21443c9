"""Random numbers by position: any block of a keyed stream, without drawing what lies before it.

A sub-layer that holds rows ``[r0, r1)`` of a (batch x units) random matrix needs
entries ``r0·units ... r1·units`` of the serial run's stream.  Drawing the whole
matrix on every worker and slicing costs every worker the serial run's random
numbers; here a worker jumps to its block instead (PCG64's ``advance``), so
partitioned runs draw exactly the serial numbers and only their share of them.

Layout: the stream of (seed, name) is cut into draws of 2**64 outputs, one per
key ``(phase, step, draw)``; within a draw, float32 number ``k`` is one half of
64-bit output ``k // 2`` (numpy's ``random(dtype=float32)`` takes the low half
first, then the high half of the same output).
"""
from __future__ import annotations

import zlib

import numpy as np

_STEP_BITS, _DRAW_BITS = 32, 16


class KeyedStream:
    """The random stream of (seed, name): blocks of uniform or Gaussian float32 numbers."""

    def __init__(self, seed: int, name: str):
        start = np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFFFFFF, zlib.crc32(name.encode())]))
        self._start = start.state
        self._bitgen = np.random.PCG64()
        self._generator = np.random.Generator(self._bitgen)

    def uniform(self, key: tuple[int, int, int], start: int, count: int) -> np.ndarray:
        """Numbers ``start ... start + count`` of draw ``key = (phase, step, draw)``, in [0, 1).  # (count,)"""
        phase, step, draw = key
        if not (0 <= step < 2 ** _STEP_BITS and 0 <= draw < 2 ** _DRAW_BITS and 0 <= phase < 256):
            raise ValueError(f"random draw {key}: expected phase < 256, step < 2**32, draw < 2**16")
        index = (((phase << _STEP_BITS) | step) << _DRAW_BITS) | draw
        self._bitgen.state = self._start
        self._bitgen.advance((index << 64) + start // 2)
        if start % 2:  # the block starts with the high half of an output: use up the low half
            self._generator.random(1, dtype=np.float32)
        return self._generator.random(count, dtype=np.float32)

    def normal(self, key: tuple[int, int, int], start: int, count: int) -> np.ndarray:
        """Standard normal numbers ``start ...`` of draw ``key``, each from two uniforms (Box-Muller),
        so that any block can be drawn alone.  # (count,)"""
        u = self.uniform(key, 2 * start, 2 * count).astype(np.float64).reshape(count, 2)
        radius = np.sqrt(-2.0 * np.log1p(-u[:, 0]))  # 1 - u in (0, 1]: no log(0)
        return (radius * np.cos(2 * np.pi * u[:, 1])).astype(np.float32)


def rows_block(stream_draw, key: tuple[int, int, int], rows: tuple[int, int], width: int,
               columns: tuple[int, int]) -> np.ndarray:
    """Rows ``rows`` and columns ``columns`` of a (batch x width) random matrix drawn row by row:
    the rows are one contiguous block of the stream; columns are sliced from them.  # (rows, columns)"""
    (r0, r1), (c0, c1) = rows, columns
    block = stream_draw(key, r0 * width, (r1 - r0) * width).reshape(r1 - r0, width)
    return block if (c0, c1) == (0, width) else block[:, c0:c1]
