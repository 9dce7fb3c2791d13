"""Strategies for the mx claims: arrays of MX blocks built from edge kinds (parity/drivers/
mx.py's EDGE_KINDS: amax exactly at, just below and 1-3 ulps above a power of two or the
element max, zero and -0 blocks, a single NaN or inf, subnormal-only blocks, an outlier, the
smallest scales), each block placed at its own power of two."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from parity.drivers.mx import EDGE_KINDS, edge_block
from reference.mx import ELEMENT_FORMATS, SCALE_MODES


@st.composite
def mx_blocks(draw: st.DrawFn, max_blocks: int = 6, block_size: int = 32
              ) -> tuple[str, str, list[str], np.ndarray]:
    """(element format, scale mode, the kind of each block, float32 (rows, blocks *
    block_size)): one to `max_blocks` blocks a row, one or two rows."""
    fmt = draw(st.sampled_from(ELEMENT_FORMATS))
    mode = draw(st.sampled_from(SCALE_MODES))
    rows = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_blocks))
    kinds = draw(st.lists(st.sampled_from(EDGE_KINDS), min_size=rows * n, max_size=rows * n))
    shifts = draw(st.lists(st.integers(-100, 100), min_size=rows * n, max_size=rows * n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = [edge_block(k, fmt, j, rng, block_size) for k, j in zip(kinds, shifts, strict=True)]
    return fmt, mode, kinds, np.concatenate(blocks).reshape(rows, n * block_size)
