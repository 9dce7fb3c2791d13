"""Hypothesis strategies for nn (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

# Arrays for the compact model: float32/float64 values spread over several orders of
# magnitude (including exact zeros and signed zeros, which ReLU's sign rules reach), shapes
# with 1-3 leading batch dimensions, and small layer sizes.

NN_DTYPES = (np.float32, np.float64)


def nn_shapes(min_dims: int = 1, max_dims: int = 3, max_side: int = 9
              ) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes for layer inputs: 1-3 dimensions, sides 1..max_side."""
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def nn_arrays(draw: st.DrawFn, shape: tuple[int, ...], dtype: type,
              max_magnitude: float = 30.0) -> np.ndarray:
    """Values x = s * N(0, 1)-like with s in {1e-3, 1, max_magnitude}, some exact +-0."""
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from((1e-3, 1.0, max_magnitude)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale
    zeros = rng.random(shape) < draw(st.sampled_from((0.0, 0.1)))
    x[zeros] = np.copysign(0.0, rng.standard_normal(int(zeros.sum())))
    return x.astype(dtype)


def mlp_sizes(max_layers: int = 4, max_width: int = 24) -> st.SearchStrategy[list[int]]:
    """Layer widths (d_in, h_1, ..., d_out) of a small MLP: 2..max_layers+1 entries."""
    return st.lists(st.integers(1, max_width), min_size=2, max_size=max_layers + 1)
