"""Hypothesis strategies for amp and loss scaling (conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from common.arg_ranges import BACKOFF_FACTORS, GROWTH_FACTORS
from parity.strategies.edges import declared_values


# Scales are float32 (the scaler's dtype): powers of two, arbitrary values, the subnormal
# floor and the float32 ceiling, where growth is capped (NOTE [ Scale update rounding ]).
def scaler_scales() -> st.SearchStrategy[float]:
    """Positive finite float32 scales: powers of two, random bit patterns, both extremes."""
    f32 = np.finfo(np.float32)
    return st.one_of(
        st.integers(-149, 127).map(lambda e: math.ldexp(1.0, e)),
        st.integers(1, 0x7F7FFFFF).map(
            lambda b: float(np.array(b, dtype=np.uint32).view(np.float32))),
        st.sampled_from([float(f32.max), float(f32.max) / 2, float(f32.smallest_subnormal),
                         2.0**16, 2.0**24]),
    )


def scaler_factors() -> st.SearchStrategy[tuple[float, float]]:
    """(growth_factor > 1, backoff_factor < 1): torch's defaults, factors near 1 and 16 and
    0, and any of the declared ranges (common/arg_ranges.py: growth up to inf, backoff in
    (0, 1) here, the ranges' negative backoffs being parity/test_loss_scaling_edges.py's)."""
    return st.tuples(
        st.one_of(st.just(2.0), st.floats(1.0, 16.0, exclude_min=True),
                  declared_values(GROWTH_FACTORS)),
        st.one_of(st.just(0.5), st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
                  declared_values(BACKOFF_FACTORS).filter(lambda b: b > 0)),
    )


def scaler_hyper() -> st.SearchStrategy[dict]:
    """GradScaler keyword arguments with non-power-of-two factors and short intervals."""
    return st.builds(
        lambda scale, factors, interval: {"init_scale": scale, "growth_factor": factors[0],
                                          "backoff_factor": factors[1],
                                          "growth_interval": interval},
        scaler_scales(), scaler_factors(), st.integers(1, 4))


def scaler_grad_stream(shapes: list[tuple[int, ...]]) -> st.SearchStrategy[list[np.ndarray]]:
    """One float32 gradient per shape: normals times 2^k (k in [-140, 70]), and with some
    probability a +inf, -inf or NaN planted in any of them."""

    def build(seed: int, k: int, plant: int, where: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        with np.errstate(over="ignore"):
            grads = [(rng.standard_normal(s) * 2.0**k).astype(np.float32) for s in shapes]
        if plant < 3:
            flat = grads[where % len(grads)].reshape(-1)
            flat[int(rng.integers(flat.size))] = (np.inf, -np.inf, np.nan)[plant]
        return grads

    return st.builds(build, st.integers(0, 2**32 - 1), st.integers(-140, 70),
                     st.integers(0, 5), st.integers(0, 7))


# Clipping: gradient lists whose global norm lands below, near and above max_norm (both
# branches of the clamp), and planted inf/NaN that make the norm non-finite.
def clip_grad_lists(max_size: int = 300) -> st.SearchStrategy[list[np.ndarray]]:
    """1-5 float32 gradients of 0-max_size elements, one magnitude 2^k (k in [-30, 30])
    times normals, an inf or NaN planted in some of them."""

    def build(seed: int, sizes: list[int], k: int, plant: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        grads = [(rng.standard_normal(n) * 2.0**k).astype(np.float32) for n in sizes]
        if plant < 3 and any(g.size for g in grads):
            g = next(g for g in grads if g.size)
            g[int(rng.integers(g.size))] = (np.inf, -np.inf, np.nan)[plant]
        return grads

    return st.builds(build, st.integers(0, 2**32 - 1),
                     st.lists(st.integers(0, max_size), min_size=1, max_size=5),
                     st.integers(-30, 30), st.integers(0, 12))


def clip_norms() -> st.SearchStrategy[float]:
    """Total norms for clip_grads_with_norm_ with max_norm = 1: any positive float32, 0,
    inf, NaN, and values within a few ulps of 1 - 1e-6 (where the clamp switches)."""
    edge = int(np.float32(1.0 - 1e-6).view(np.uint32))
    near_edge = st.integers(-4, 4).map(
        lambda d: float(np.array(edge + d, dtype=np.uint32).view(np.float32)))
    return st.one_of(
        st.floats(0.0, float(np.finfo(np.float32).max), width=32), near_edge,
        st.sampled_from([0.0, float("inf"), float("nan"), 1.0]),
    )
