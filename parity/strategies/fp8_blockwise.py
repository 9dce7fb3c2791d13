"""Strategies for the fp8_blockwise claims: edge tiles by input class (the classes where the
three variants of reference/fp8_blockwise.py part), and matrices of any shape mixing them."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from common.arg_ranges import BLOCKWISE_VARIANTS, TILE_SIDES
from parity.strategies.edges import declared_values

_TILE = 128  # one 1x128 tile per row of an edge matrix
_FLT_MAX = float(np.finfo(np.float32).max)  # 0x1.fffffep127


def _row(rng: np.random.Generator, amax: float) -> np.ndarray:
    """128 float32 values in (-amax, amax) with |x| = amax at one place."""
    row = (rng.uniform(-1.0, 1.0, _TILE) * amax).astype(np.float32)
    row[rng.integers(0, _TILE)] = np.float32(amax) * rng.choice([-1, 1])
    return row


def _around(v: float) -> list[float]:
    """v and its float32 neighbours."""
    f = np.float32(v)
    return [float(np.nextafter(f, np.float32(0))), float(f), float(np.nextafter(f, np.inf))]


def blockwise_edge_tiles(seed: int = 0) -> dict[str, np.ndarray]:
    """Input class -> float32 (rows, 128): one 1x128 tile per row, each class's edge reached
    (the classes of docs/fp8.md's table, in its order)."""
    rng = np.random.default_rng(seed)
    powers = [a for k in range(-20, 21, 4) for a in _around(2.0**k)]
    special = {}
    for name, value in (("one +inf", np.inf), ("one -inf", -np.inf), ("one NaN", np.nan)):
        rows = np.stack([_row(rng, 2.0**k) for k in (-8, 0, 8)])
        rows[:, 7] = value
        special[name] = rows
    classes = {
        "finite, amax 2^-20..2^20": np.stack([_row(rng, 2.0 ** rng.uniform(-20, 20))
                                              for _ in range(16)]),
        "all zero": np.zeros((2, _TILE), np.float32),
        **special,
        "amax 448 and its neighbours": np.stack([_row(rng, a) for a in _around(448.0)]),
        "amax 2^k and its neighbours": np.stack([_row(rng, a) for a in powers]),
        "amax FLT_MAX": np.stack([_row(rng, _FLT_MAX) for _ in range(2)]),
        "amax in [1e-12, 1e-4)": np.stack([_row(rng, a) for a in (5e-5, 1e-8, 2e-12)]),
        "amax below 1e-12, normal": np.stack([_row(rng, a) for a in (5e-13, 2.0**-120)]),
        "subnormal amax": np.stack([_row(rng, a) for a in (2.0**-130, 2.0**-149)]),
    }
    return {name: rows.astype(np.float32) for name, rows in classes.items()}


def blockwise_edge_matrix(seed: int = 0) -> np.ndarray:
    """Every edge class's tiles stacked: float32 (rows, 128)."""
    return np.concatenate(list(blockwise_edge_tiles(seed).values()))


@st.composite
def blockwise_tensors(draw: st.DrawFn, max_size: int = 300
                      ) -> tuple[np.ndarray, tuple[int, int], str]:
    """(x, tile, variant): a float32 matrix of 1..max_size x 1..max_size values across many binades
    (shapes not divisible by the tile included), a few of them 0, +-inf, NaN or subnormal;
    tile 1x128, 128x128, a small one or any two sides of TILE_SIDES; any variant."""
    m, n = draw(st.integers(1, max_size)), draw(st.integers(1, max_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    e = rng.integers(draw(st.integers(-149, 0)), draw(st.integers(0, 127)) + 1, (m, 1))
    with np.errstate(over="ignore", under="ignore"):
        x = (rng.uniform(-2.0, 2.0, (m, n)) * np.ldexp(1.0, e)).astype(np.float32)
    for value in draw(st.lists(st.sampled_from([0.0, np.inf, -np.inf, np.nan, 2.0**-149]),
                               max_size=4)):
        x[rng.integers(0, m), rng.integers(0, n)] = value
    # DeepSeek's tiles, small ones, and any side of the declared range (a side past the
    # matrix's covers all of it)
    side = declared_values(TILE_SIDES)
    tile = draw(st.sampled_from([(1, 128), (128, 128), (1, 16), (3, 5)]) | st.tuples(side, side))
    variant = draw(declared_values(BLOCKWISE_VARIANTS))
    return x, tile, variant


def _pow2_tiles(rng: np.random.Generator, shape: tuple[int, int], tile: tuple[int, int]
                ) -> np.ndarray:
    """float32 (M, K) whose every tile has amax exactly 448 * 2^k, k in [-10, 10] per tile."""
    m, k = shape
    r, c = tile
    x = rng.uniform(-1.0, 1.0, shape)
    for i in range(0, m, r):
        for j in range(0, k, c):
            block = x[i : i + r, j : j + c]
            block[np.unravel_index(np.argmax(np.abs(block)), block.shape)] = rng.choice([-1, 1])
            block *= 448.0 * 2.0 ** int(rng.integers(-10, 11))
    return x.astype(np.float32)


def blockwise_gemm_operands(seed: int = 0, m: int = 16, k: int = 512, n: int = 256
                            ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Input class -> (x (M, K), w (K, N)) float32: the GEMM's activations (1x128 tiles) and
    weights (128x128 blocks), one pair per class of docs/fp8.md's GEMM table, in its order."""
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    heavy = rng.standard_t(3, (m, k)).astype(np.float32)
    heavy_w = rng.standard_t(3, (k, n)).astype(np.float32)
    small = (rng.standard_normal((m, k)) * 1e-6).astype(np.float32)
    with_inf = normal.copy()
    with_inf[3, 200] = np.inf
    return {
        "N(0, 1) both": (normal, w),
        "every tile's amax 448 * 2^k": (_pow2_tiles(rng, (m, k), (1, 128)),
                                        _pow2_tiles(rng, (k, n), (128, 128))),
        "Student-t (3 dof) both": (heavy, heavy_w),
        "activations ~1e-6 (below DeepSeek's 1e-4 floor)": (small, w),
        "one +inf activation": (with_inf, w),
    }
