"""Measuring in a format: whether a value is a member of it, and how many of its steps lie
between two members. The ruler the `ulps` claims are counted with (parity/compare.py) and
the reference's tests measure by; not a twin (torch has neither: a ruler measures, it does
not train), so it lives with the proof, built on the reference's encode and decode.
"""

from __future__ import annotations

import numpy as np

from reference.formats import FloatFormat, decode, encode, get_format

__all__ = ["is_member", "ulp_distance"]


def is_member(x: object, fmt: str | FloatFormat) -> np.ndarray:
    """Whether each value is a member of `fmt`: exactly representable, so that encode then
    decode gives it back bit for bit (+-0 and, in IEEE formats, +-inf are members; NaN is
    not). `x` is any floating-point array (float16/32/64, or an ml_dtypes type)."""
    return _member_codes(np.asarray(x), get_format(fmt))[1]


def _member_codes(x: np.ndarray, fmt: FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """(codes, is a member): x's codes in fmt, and whether they decode back to x exactly."""
    if x.dtype.kind not in "fV":
        raise TypeError(f"expected floating-point values, got dtype {x.dtype}")
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        wide = x.astype(np.float64)
    codes = encode(wide, fmt, overflow="inf" if fmt.inf_code is not None else
                   "saturate" if fmt.convention == "finite" else "nan")
    back = decode(codes, fmt)
    return codes, (back.view(np.uint64) == wide.view(np.uint64)) & ~np.isnan(wide)


def ulp_distance(a: object, b: object, fmt: str | FloatFormat) -> np.ndarray:
    """How many steps of `fmt` lie between members a and b: the number of times nextafter in
    the format takes a to b. uint64, of a's and b's one shape.

    Counted on the monotone codes: same sign, |code_a - code_b|; opposite signs, the two
    magnitudes' codes add up (+0 and -0 are 0 apart). Exact for every format, float64 too.
    Refuses (ValueError) a NaN or a non-member, naming the first one: a distance measured
    after rounding both sides would hide a missing rounding.
    """
    fmt = get_format(fmt)
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"ulp_distance needs arrays of one shape, got {a.shape} and {b.shape}")
    codes = []
    for name, v in (("a", a), ("b", b)):
        c, member = _member_codes(v, fmt)
        if not member.all():
            index = tuple(int(i) for i in np.unravel_index(int(np.argmin(member)), v.shape))
            bad = float(v[index])
            raise ValueError(
                f"ulp_distance counts steps between members of {fmt.name}, but "
                f"{name}{list(index) if index else ''} = {bad!r} is "
                f"{'NaN' if bad != bad else 'not exactly representable'} (a member is a value "
                f"that encode then decode gives back bit for bit)")
        codes.append(c.astype(np.uint64))
    ca, cb = codes
    sign = np.uint64(fmt.bits - 1)
    magnitude = np.uint64(2 ** (fmt.bits - 1) - 1)
    ma, mb = ca & magnitude, cb & magnitude
    same_sign = (ca >> sign) == (cb >> sign)
    return np.where(same_sign, np.maximum(ma, mb) - np.minimum(ma, mb), ma + mb)
