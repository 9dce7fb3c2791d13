"""Running the small formats (parity/oracles.py SMALL_FORMATS) in the reference, ml_dtypes
and torch, and the oracle their toward-zero and stochastic rounding are judged by.

The oracle's members are ml_dtypes' decoded code table (a library the reference does not
use), its arithmetic fractions.Fraction: it shares no code with reference.formats."""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import numpy as np
import torch

import reference.formats as ref
from parity import oracles


def ml_values(name: str) -> np.ndarray:
    """The float64 value of every code, as ml_dtypes decodes it."""
    codes = np.arange(2 ** ref.FORMATS[name].bits, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        return codes.view(oracles.ML_DTYPES[name]).astype(np.float64)


def ml_encode(x: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' codes of float32 or float64 x (uint8)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(oracles.ML_DTYPES[name]).view(np.uint8)


def ml_encode_stated(x: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' codes with its one declared difference from the reference applied:
    float8_e8m0fnu's +-0, NaN in ml_dtypes 0.7, is 2^-127 (code 0) in the reference (NOTE
    [ E8M0 at zero ]; claim formats.e8m0_ml_dtypes holds that it is the only one)."""
    codes = ml_encode(x, name)
    if name == "float8_e8m0fnu":
        codes = np.where(x == 0, np.uint8(0), codes)
    return codes


def torch_encode(x: np.ndarray, name: str) -> np.ndarray:
    """torch's native cast's codes (formats in oracles.TORCH_CASTS only)."""
    return torch.from_numpy(np.array(x, order="C")).to(getattr(torch, name)) \
        .view(torch.uint8).numpy()


@functools.cache
def members(name: str) -> tuple[Fraction, ...]:
    """The non-negative finite values in order, from ml_dtypes' table."""
    v = ml_values(name)
    return tuple(sorted({Fraction(float(a)) for a in v[np.isfinite(v) & (v >= 0)]}))


def edge_inputs(name: str, seed: int = 0, n_random: int = 4096) -> np.ndarray:
    """float32: every member, every midpoint between neighbours (ties) and 1 and 2 float32
    ulps either side, the overflow boundary's neighbourhood, specials, random bit patterns;
    both signs."""
    m = np.array([float(a) for a in members(name)])
    spacing_top = m[-1] - m[-2]
    m = np.append(m, m[-1] + spacing_top)  # the first value beyond max: its tie is the bound
    mids = ((m[1:] + m[:-1]) / 2).astype(np.float32)
    around = [mids]
    for direction in (np.inf, -np.inf):
        step = mids
        for _ in range(2):
            step = np.nextafter(step, np.float32(direction))
            around.append(step)
    specials = np.array([0.0, np.inf, np.nan, m[0] / 2, m[0] / 4, 2.0**-130, 1e-45, 3e38],
                        dtype=np.float32)
    bits = np.random.default_rng(seed).integers(0, 2**32, size=n_random, dtype=np.uint32)
    x = np.concatenate([m.astype(np.float32), *around, specials, bits.view(np.float32)])
    return np.concatenate([x, -x])


def oracle_round(x: float, name: str, rounding: str, word: int = 0) -> float:
    """x rounded toward zero, or stochastically with the 32-bit `word`, overflow saturating
    (the policy both roundings are run with), as a float (NaN for no value)."""
    fmt = ref.FORMATS[name]
    if math.isnan(x):
        # no NaN: a zero of the NaN's sign inverted (NOTE [ NaN to a finite format ])
        return math.nan if fmt.nan_count else math.copysign(0.0, -math.copysign(1.0, x))
    negative = math.copysign(1.0, x) < 0
    if fmt.convention == "unsigned" and negative and x != 0:
        return math.nan
    if fmt.convention == "unsigned":  # +-0 is below 2^-127: the smallest (NOTE [ E8M0 at zero ])
        negative = False
    lo, hi, threshold = _neighbours(abs(x), name)
    value = float(hi if rounding == "stochastic" and word < threshold else lo)
    if negative and not (value == 0 and not fmt.has_negative_zero):
        value = -value
    return value


def _neighbours(a: float, name: str) -> tuple[Fraction, Fraction, int]:
    """(lo, hi, t) for |x| = a: lo the member toward zero (max beyond max; E8M0's smallest
    below it), hi the next member up (lo itself at max, and where lo is |x|), and t =
    floor(2^32 p), p = (a - lo) / (hi - lo): the words below t round up."""
    vals = members(name)
    exact = Fraction(vals[-1]) if math.isinf(a) else Fraction(a)
    k = bisect.bisect_right(vals, exact)  # vals[:k] are the members <= |x| (vals ascend)
    lo = vals[k - 1] if k else vals[0]
    if not k or lo == exact or lo == vals[-1]:
        return lo, lo, 0
    hi = vals[k]
    return lo, hi, math.floor((exact - lo) / (hi - lo) * 2**32)


def oracle_threshold(x: float, name: str) -> int:
    """The count of 32-bit words that round |x| up (0 for NaN and where nothing rounds)."""
    if math.isnan(x) or (ref.FORMATS[name].convention == "unsigned" and not x > 0):
        return 0
    return _neighbours(abs(x), name)[2]
