"""Members of a low-precision format counted in order: a value's ordinal, the member at an
ordinal, how many members a rounding interval spans, and a result moved toward another by
an allowance of members. The amp drivers compare the trees' fp16/bf16 results with these
(parity/drivers/amp.py, gpt_core_amp.py, gpt_free.py).
"""

from __future__ import annotations

import numpy as np

from reference.formats import decode, encode, get_format


def ordinal(v: np.ndarray, fmt: str) -> np.ndarray:
    """The position of round-to-nearest-even(v) among the members of fmt, as a signed
    integer (+0 and -0 are both 0; neighbours differ by 1)."""
    f = get_format(fmt)
    with np.errstate(over="ignore"):
        code = encode(np.asarray(v, dtype=np.float64), fmt).astype(np.int64)
    magnitude = code & (2 ** (f.bits - 1) - 1)
    return np.where(code >> (f.bits - 1) == 1, -magnitude, magnitude)


def from_ordinal(o: np.ndarray, fmt: str) -> np.ndarray:
    """The member of fmt at ordinal o (float32), the inverse of `ordinal` on members."""
    f = get_format(fmt)
    code = np.abs(o) | np.where(o < 0, 1 << (f.bits - 1), 0)
    return decode(code.astype(f.code_dtype), fmt, dtype=np.float32)


def rounding_spread(v: np.ndarray, delta: np.ndarray, fmt: str) -> np.ndarray:
    """k = ord(q(v + delta)) - ord(q(v - delta)): two values within delta of v round to
    members at most k apart (q is monotone); k = 0 when no rounding boundary of fmt lies in
    [v - delta, v + delta], i.e. both results must be the same member."""
    v = np.asarray(v, dtype=np.float64)
    d = np.asarray(delta, dtype=np.float64) * (1 + 2.0**-40) + 2.0**-50 * np.abs(v)
    return ordinal(v + d, fmt) - ordinal(v - d, fmt)


def toward(b: np.ndarray, a: np.ndarray, k: np.ndarray, fmt: str) -> np.ndarray:
    """b moved toward a by at most k members of fmt: ulp_distance(a, toward(b, a, k)) is
    max(0, ulp_distance(a, b) - k), the ulps beyond a per-element allowance k."""
    oa, ob = ordinal(a, fmt), ordinal(b, fmt)
    return from_ordinal(ob + np.clip(oa - ob, -k, k), fmt)
