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


# Absorption: one large term among many below half its ulp. A running sum that meets the
# large term first drops the small ones, a tree that adds the small ones first keeps them,
# so the two trees' summation orders differ by up to (number of small terms) x (their size):
# the inputs that drive the reductions' any-order bounds toward their worst case.
def absorbing_residuals(rng: np.random.Generator, shape: tuple[int, ...], dtype: type
                        ) -> np.ndarray:
    """Residuals d: one of magnitude 1..4, the rest so small that d_i^2 < ulp(d_max^2) / 4."""
    big = rng.uniform(1.0, 4.0)
    tiny = big * np.sqrt(float(np.finfo(dtype).eps) / 8)
    d = rng.uniform(0.5, 1.0, shape) * tiny * rng.choice([-1.0, 1.0], shape)
    d.reshape(-1)[rng.integers(d.size)] = big
    return d.astype(dtype)


def absorbing_logits(rng: np.random.Generator, shape: tuple[int, ...], dtype: type
                     ) -> np.ndarray:
    """Logits (..., C) with one dominant class per row and the others at least
    ln(2 / eps) below it, so that every exp(x - max) but one is under half an ulp of 1."""
    gap = np.log(2.0 / float(np.finfo(dtype).eps))
    top = rng.uniform(-1.0, 1.0, (*shape[:-1], 1))
    x = top - gap - rng.uniform(0.0, 2.0, shape)
    np.put_along_axis(x, rng.integers(0, shape[-1], (*shape[:-1], 1)), top, axis=-1)
    return x.astype(dtype)


def nn_absorbing_residuals(shape: tuple[int, ...], dtype: type
                           ) -> st.SearchStrategy[np.ndarray]:
    """absorbing_residuals from a drawn seed."""
    return st.integers(0, 2**32 - 1).map(
        lambda seed: absorbing_residuals(np.random.default_rng(seed), shape, dtype))


def nn_absorbing_logits(shape: tuple[int, ...], dtype: type) -> st.SearchStrategy[np.ndarray]:
    """absorbing_logits from a drawn seed."""
    return st.integers(0, 2**32 - 1).map(
        lambda seed: absorbing_logits(np.random.default_rng(seed), shape, dtype))
