"""Strategies for the mx claims: arrays of MX blocks built from edge kinds (EDGE_KINDS: amax
exactly at, just below and 1-3 ulps above a power of two or the element max, zero and -0
blocks, a single NaN or inf, subnormal-only blocks, an outlier, ties, the smallest scales,
an amax 1 to 48 ulps below a power of two, -0 elements),
each block placed at its own power of two; `edge_block` builds one, `edge_array` every kind
for the fixed inputs of the oracle and twin tests, `mx_blocks` draws them."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from reference.formats import FORMATS
from reference.mx import BLOCK_SIZE, ELEMENT_FORMATS, SCALE_MODES

# The kinds of edge block (one block of BLOCK_SIZE values each; `j` a power-of-two shift)
EDGE_KINDS = ("random", "pow2_amax", "below_pow2", "above_pow2", "elem_max", "above_elem_max",
              "zero", "signed_zero", "one_nan", "one_inf", "subnormal", "outlier", "ties",
              "tiny_scale", "ulps_below_pow2", "negative_zeros")


def edge_block(kind: str, fmt: str, j: int, rng: np.random.Generator,
               block_size: int = BLOCK_SIZE) -> np.ndarray:
    """One float32 block of the given kind, its amax placed at about 2^j (|j| <= 100)."""
    top = FORMATS[fmt].max
    x = rng.standard_normal(block_size) * 2.0 ** (j - 2)
    x = np.clip(x, -(2.0**j) * 0.99, 2.0**j * 0.99)  # below the amax placed next
    amax = {"pow2_amax": 2.0**j, "elem_max": top * 2.0 ** (j - 3)}.get(kind)
    x = x.astype(np.float32)
    i = int(rng.integers(block_size))
    with np.errstate(over="ignore"):
        if amax is not None:
            x[i] = np.float32(amax) * rng.choice([-1, 1])
        elif kind == "below_pow2":
            x[i] = np.nextafter(np.float32(2.0**j), np.float32(0))
        elif kind in ("above_pow2", "above_elem_max"):  # 1 to 3 ulps above: rceil's trap
            base = np.float32(2.0**j if kind == "above_pow2" else top * 2.0 ** (j - 3))
            word = base.view(np.uint32) + np.uint32(rng.integers(1, 4))
            x[i] = word.view(np.float32)
        elif kind in ("zero", "signed_zero"):
            x[:] = 0.0 if kind == "zero" else -0.0
        elif kind == "one_nan":
            x[i] = np.nan
        elif kind == "one_inf":
            x[i] = np.inf * rng.choice([-1, 1])
        elif kind == "subnormal":  # every value a float32 subnormal (amax < 2^-126)
            x = (rng.integers(-2**23 + 1, 2**23, block_size) * 2.0**-149).astype(np.float32)
        elif kind == "outlier":  # one value 2^20 above the rest
            x[i] = np.float32(2.0 ** (j + 20))
        elif kind == "ties":  # amax 2^j (scale 2^(j - e_max) in every mode), the rest ties
            spec = FORMATS[fmt]
            m = spec.mantissa_bits
            t = rng.integers(spec.min_exponent, spec.emax, block_size)  # binades below amax
            odd = 2 * rng.integers(2**m, 2 ** (m + 1), block_size) + 1  # halfway codes
            q = odd * np.exp2(t - m - 1.0) * rng.choice([-1, 1], block_size)
            x = (q * 2.0 ** (j - spec.emax)).astype(np.float32)
            x[i] = np.float32(2.0**j)
        elif kind == "ulps_below_pow2":  # 1 to 48 ulps below 2^j: float32 log2 rounds to j
            word = np.float32(2.0**j).view(np.uint32) - np.uint32(rng.integers(1, 49))
            x[i] = word.view(np.float32)
        elif kind == "negative_zeros":  # -0 elements, and negatives that round to zero
            x[rng.integers(block_size, size=block_size // 4)] = -0.0
            x[rng.integers(block_size, size=4)] = np.float32(-(2.0 ** (j - 40)))
        elif kind == "tiny_scale":  # amax near 2^-127 * max_elem: the scale code 0 or 1
            x = (x * np.float32(2.0 ** (-120 - j))).astype(np.float32)
    return x


def edge_array(fmt: str, seed: int = 0, per_kind: int = 8) -> np.ndarray:
    """(rows, BLOCK_SIZE) float32: `per_kind` blocks of every EDGE_KINDS kind, j from -100
    to 100 (the default inputs of the oracle and twin tests)."""
    rng = np.random.default_rng(seed)
    rows = [edge_block(k, fmt, int(rng.integers(-100, 101)), rng)
            for k in EDGE_KINDS for _ in range(per_kind)]
    return np.stack(rows)


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
