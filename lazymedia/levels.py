"""The level coder: a tensor's element bit patterns as small codes into per-group tables of the
distinct patterns (native, csrc/levels.cpp, the GIL released). The cache stores values in this
form (cache/_serialize.py), so its file format depends on what these functions compute: a change
to the coding is a change to the format.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from . import _C
from .memory import kernel_threads


def encode(
    bits: npt.NDArray[np.generic],
    run: int,
    groups: int,
    levels: int,
    codes: npt.NDArray[np.generic],
    tables: npt.NDArray[np.generic],
    half: int = 0,
) -> list[int] | None:
    """Level-codes the bit patterns `bits` (1-d uint16/32/64) into `codes` (uint8/uint16, as many),
    element i against table (i // run) % groups of `tables` (groups x levels, bits' type), on the
    kernel threads: the tables' counts, or None once a group has more than `levels` patterns.
    With `half`, every block of 2 * half patterns must repeat its first half (None where one does
    not) and `codes` holds the first halves' codes (half as many): `decode`'s `half` form,
    with the comparison made while each block is in cache for its coding."""
    return _C.level_encode(bits, run, groups, levels, codes, tables, kernel_threads(), True, half)


def decode(
    codes: npt.NDArray[np.generic],
    run: int,
    groups: int,
    tables: npt.NDArray[np.generic],
    out: npt.NDArray[np.generic],
    half: int = 0,
) -> bool:
    """out[i] = tables[(i // run) % groups][codes[i]] (tables: groups equal tables, flat), on one
    thread (a memory-bound pass on the request path: a second thread gained nothing when measured);
    with `half`, the codes hold the first half of each block of 2 * half elements and out twice
    as many (the second half of each block a copy of the first). False for a code past its table
    (nothing is read out of bounds)."""
    return _C.level_decode(codes, run, groups, tables, out, 1, True, half)
