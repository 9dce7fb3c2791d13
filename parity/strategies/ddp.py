"""Strategies for the ddp claims: the values ws ranks contribute to one all-reduce."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from parity.compare import numpy_dtype

RANK_DTYPES = ("float16", "bfloat16", "float32", "float64")


@st.composite
def rank_values(draw: st.DrawFn, max_ws: int = 6, max_n: int = 64) -> tuple[str, list]:
    """(dtype, one array per rank): ws in [2, max_ws], n in [1, max_n] elements of one dtype,
    drawn as sign * 2^e * (1 + f) over the dtype's whole exponent range (subnormals and
    near-cancelling pairs included) but below max / ws^2, so no sum of them overflows."""
    dtype = draw(st.sampled_from(RANK_DTYPES))
    ws = draw(st.integers(2, max_ws))
    n = draw(st.integers(1, max_n))
    info = ml_dtypes.finfo(numpy_dtype(dtype))
    # below max / ws^2: no sum overflows, nor the bound's (ws - 1) sum|x| in float64
    low = int(np.log2(float(info.smallest_subnormal)))
    high = int(np.log2(float(info.max) / ws**2))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = draw(st.integers(0, high - 1 - low))  # how many binades the values span
    top = draw(st.integers(low + spread, high - 1))
    exponents = rng.integers(top - spread, top + 1, size=(ws, n))
    values = rng.choice([-1.0, 1.0], size=(ws, n)) * np.ldexp(1.0 + rng.random((ws, n)),
                                                               exponents)
    if draw(st.booleans()):  # rank 1 nearly cancels rank 0 (a sum far below its terms)
        values[1] = -values[0] * (1 + np.ldexp(rng.random(n), -8))
    with np.errstate(over="raise"):
        arrays = [v.astype(numpy_dtype(dtype)) for v in values]
    return dtype, arrays
