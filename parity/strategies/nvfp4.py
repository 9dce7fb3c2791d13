"""Strategies for the nvfp4 claims: edge tensors by input class (the edge cases of
Transformer Engine's NVFP4 recipe, docs/sources/block_scaling.md 1.11, and the classes where
its steps part), and tensors of any shape mixing them under hypothesis."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

NVFP4_EDGE_SHAPE = (33, 40)  # neither tile divides it: rows and columns are padded
_FLT_MAX = float(np.finfo(np.float32).max)  # 0x1.fffffep127


def _normal(rng: np.random.Generator, shape: tuple[int, int] = NVFP4_EDGE_SHAPE,
            binades: int = 0) -> np.ndarray:
    """N(0, 1) values, each row times 2^k for k uniform in [-binades, binades]."""
    k = rng.integers(-binades, binades + 1, (shape[0], 1))
    return (rng.standard_normal(shape) * np.ldexp(1.0, k)).astype(np.float32)


def nvfp4_edge_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """Input class -> float32 (33, 40), each class's edge reached: TE's edge cases and the
    places its steps part (the RHT's tests take the bfloat16 of each)."""
    rng = np.random.default_rng(seed)
    classes = {}
    classes["N(0, 1), rows across 2^-20..2^20"] = _normal(rng, binades=20)
    classes["all zero"] = np.zeros(NVFP4_EDGE_SHAPE, np.float32)
    for name, value in (("one +inf", np.inf), ("one -inf", -np.inf), ("one NaN", np.nan)):
        x = _normal(rng)
        x[5, 17] = value
        classes[name] = x
    tiny = _normal(rng)
    tiny[:, 16:32] *= np.float32(1e-7)  # S = e4m3(amax 448 / A) rounds to 0: below 2^-10
    tiny[16:, :16] *= np.float32(1e-3)  # a 16x16 tile whose S is e4m3-subnormal
    classes["a block far below the amax"] = tiny
    subnormal = _normal(rng) * np.float32(2.0**-130)  # float32 subnormals only
    classes["float32 subnormals only"] = subnormal
    mixed = _normal(rng)
    mixed[::2, ::3] = np.float32(2.0**-133) * rng.integers(1, 100, mixed[::2, ::3].shape)
    classes["subnormals beside normals"] = mixed
    k = rng.integers(-6, 7, (NVFP4_EDGE_SHAPE[0], 1))
    powers = _normal(rng) * np.ldexp(1.0, k - 4).astype(np.float32)  # below 2^k: |N| < 16
    powers[:, ::16] = np.ldexp(1.0, k) * rng.choice([-1.0, 1.0], (NVFP4_EDGE_SHAPE[0], 1))
    powers[0, 0] = np.float32(2.0**7)  # A = 2^7, every block's amax 2^k
    classes["amaxes at powers of two"] = powers
    classes["A below 2688 / FLT_MAX"] = _normal(rng) * np.float32(1e-37)
    classes["amaxes near FLT_MAX"] = _normal(rng) * np.float32(_FLT_MAX / 8)
    tie = np.zeros(NVFP4_EDGE_SHAPE, np.float32)
    tie[:16, :16] = rng.choice([0.0, 3.0, -3.0, 6.0, -6.0], (16, 16))  # on both grids
    tie[0, 0], tie[0, 32] = 6.0, 768.0  # A = 768: S_enc = 2, b = 2, S6 = 2, S4 = 3
    classes["a Four Over Six tie"] = tie
    return classes


@st.composite
def nvfp4_cases(draw: st.DrawFn) -> dict:
    """A quantize call: x float32 or bfloat16 (M, N), 1..70 x 1..70 (bfloat16 with N a
    multiple of 16 for the RHT) across many binades, a few 0, +-inf, NaN or subnormal; any tile
    and rounding (rbits uint8 of x's shape), four_over_six on or off, the RHT on or off
    (never both with Four Over Six, which TE refuses)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    with_rht = draw(st.booleans())
    m = draw(st.integers(1, 70))
    n = 16 * draw(st.integers(1, 4)) if with_rht else draw(st.integers(1, 70))
    lo, hi = draw(st.integers(-140, 0)), draw(st.integers(0, 120))
    e = rng.integers(lo, hi + 1, (m, 1))
    with np.errstate(over="ignore", under="ignore"):
        x = (rng.uniform(-2.0, 2.0, (m, n)) * np.ldexp(1.0, e)).astype(np.float32)
    for value in draw(st.lists(st.sampled_from([0.0, np.inf, -np.inf, np.nan, 2.0**-149]),
                               max_size=3)):
        x[rng.integers(0, m), rng.integers(0, n)] = value
    rounding = draw(st.sampled_from(("nearest_even", "stochastic", "deepgemm")))
    four_over_six = not with_rht and rounding == "nearest_even" and draw(st.booleans())
    if with_rht or draw(st.booleans()):
        x = x.astype(ml_dtypes.bfloat16)
    return {"x": x, "tile": draw(st.sampled_from([(1, 16), (16, 16)])),
            "rounding": rounding, "four_over_six": four_over_six, "with_rht": with_rht,
            "rbits": (rng.integers(0, 256, (m, n), dtype=np.uint8)
                      if rounding == "stochastic" else None)}
