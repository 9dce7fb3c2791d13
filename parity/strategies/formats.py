"""Hypothesis strategies for formats (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from common.arg_ranges import OVERFLOW_POLICIES, RANDOM_WORDS, ROUNDING_MODES
from parity.oracles import Spec, member_value
from parity.strategies.edges import declared_values
from reference.formats import FloatFormat, get_format

# Values are built from a format's bit widths with Python's exact float arithmetic (math.ldexp
# on integers, parity.oracles), not with reference.formats' rounding, so a strategy cannot
# share a bug with the code it tests. Each returns Python floats exactly representable in
# float32 unless it says float64.


def _max_code(fmt: FloatFormat) -> int:
    return Spec.of(fmt).max_code


def _signed(values: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    return st.tuples(values, st.booleans()).map(lambda vs: -vs[0] if vs[1] else vs[0])


def _f32(x: float) -> np.float32:
    """x as a float32; values beyond float32's range become +-inf on purpose."""
    with np.errstate(over="ignore"):
        return np.float32(x)


def _f32_step(x: float, k: int) -> float:
    """x moved by k float32 ulps (k may be negative)."""
    v = _f32(x)
    toward = np.float32(np.inf if k > 0 else -np.inf)
    with np.errstate(over="ignore"):  # stepping past float32's max gives inf, on purpose
        for _ in range(abs(k)):
            v = np.nextafter(v, toward)
    return float(v)


def members(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Every finite value of the format, either sign."""
    f = get_format(fmt)
    return _signed(st.integers(0, _max_code(f)).map(lambda c: member_value(f, c)))


def ties(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Exact midpoints between adjacent members, including the tie just above max."""
    f = get_format(fmt)

    def midpoint(c: int) -> float:
        lo = member_value(f, c)
        hi = member_value(f, c + 1) if c < _max_code(f) else lo + 2.0 ** (
            f.emax - f.mantissa_bits)
        return (lo + hi) / 2

    return _signed(st.integers(0, _max_code(f)).map(midpoint))


def near_ties(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """One to three float32 ulps either side of a tie."""
    return st.tuples(ties(fmt), st.sampled_from([-3, -2, -1, 1, 2, 3])).map(
        lambda t: _f32_step(*t))


def overflow_edge(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Around the overflow boundary max + ulp(max)/2, at max, and far beyond."""
    f = get_format(fmt)
    boundary = f.max + 2.0 ** (f.emax - f.mantissa_bits - 1)
    near = st.integers(-4, 4).map(lambda k: _f32_step(boundary, k))
    far = st.sampled_from([f.max, 2 * f.max, f.max + 2.0 ** (f.emax - f.mantissa_bits),
                           float(np.finfo(np.float32).max)])
    return _signed(st.one_of(near, far))


def subnormal_edge(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Around tiny, the smallest subnormal, and half the smallest subnormal."""
    f = get_format(fmt)
    anchors = [f.tiny, f.smallest_subnormal, f.smallest_subnormal / 2,
               f.tiny - f.smallest_subnormal]
    return _signed(st.tuples(st.sampled_from(anchors), st.integers(-3, 3)).map(
        lambda t: _f32_step(*t)))


def specials() -> st.SearchStrategy[float]:
    """Signed zeros and infinities."""
    return st.sampled_from([0.0, -0.0, math.inf, -math.inf])


def nan_payloads() -> st.SearchStrategy[np.float32]:
    """float32 NaNs of either sign, quiet or signalling, with any payload."""
    return st.tuples(st.integers(1, 2**23 - 1), st.booleans()).map(
        lambda t: np.uint32((0xFF800000 if t[1] else 0x7F800000) | t[0]).view(np.float32))


def float32_bits() -> st.SearchStrategy[np.float32]:
    """Any float32 bit pattern."""
    return st.integers(0, 2**32 - 1).map(lambda b: np.uint32(b).view(np.float32))


EDGE_NAMES = ("ties", "near_ties", "overflow_edge", "subnormal_edge", "members", "specials",
              "nan_payloads", "float32_bits")


def edge_float32(fmt: str | FloatFormat) -> st.SearchStrategy[np.float32]:
    """Any of the named edges for `fmt`, as float32 scalars."""
    finite = st.one_of(ties(fmt), near_ties(fmt), overflow_edge(fmt), subnormal_edge(fmt),
                       members(fmt), specials())
    return st.one_of(finite.map(_f32), nan_payloads(), float32_bits())


def float32_arrays(fmt: str | FloatFormat, max_size: int = 64) -> st.SearchStrategy[np.ndarray]:
    """1-d float32 arrays of edge values (many values per example: cheap and thorough)."""
    return st.lists(edge_float32(fmt), min_size=1, max_size=max_size).map(
        lambda v: np.array(v, dtype=np.float32))


def double_rounding_cases(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """float64 values within a few float64 ulps of float32-representable ties of `fmt`:
    rounding through float32 lands on the tie, and the tie then breaks the wrong way
    whenever the offset's sign disagrees with the even neighbour."""
    return st.tuples(ties(fmt), st.integers(-3, 3), st.integers(0, 20)).map(
        lambda t: t[0] + math.copysign(t[1] * math.ulp(t[0]) * 2.0 ** t[2], t[0])
        if t[0] != 0 and math.isfinite(t[0]) else t[0])


def float64_bits() -> st.SearchStrategy[float]:
    """Any float64 bit pattern (full 52-bit significands, which st.floats seldom draws)."""
    return st.integers(0, 2**64 - 1).map(lambda b: float(np.uint64(b).view(np.float64)))


def float64_arrays(fmt: str | FloatFormat, max_size: int = 64) -> st.SearchStrategy[np.ndarray]:
    """1-d float64 arrays: double-rounding cases, edges, any float64, any bit pattern."""
    values = st.one_of(
        double_rounding_cases(fmt),
        edge_float32(fmt).map(float),
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        float64_bits(),
    )
    return st.lists(values, min_size=1, max_size=max_size).map(
        lambda v: np.array(v, dtype=np.float64))


# -- batches: the same edges, drawn by NumPy from one seed -----------------------------------
# Drawing each value through hypothesis costs ~2 ms (a list element, a one_of branch, a map),
# so a list strategy of edge values averages a handful of values per example. The batches
# below draw the same edge kinds as `edge_float32` and `float64_arrays`, `size` values at a
# time, vectorized from a hypothesis-drawn seed: a test draws a short hypothesis list (which
# hypothesis shrinks) plus one batch (which covers every edge kind in every example).


def _member_values(f: FloatFormat, codes: np.ndarray) -> np.ndarray:
    """member_value for an array of non-negative magnitude codes (exact: np.ldexp on ints)."""
    s = Spec.of(f)
    field, frac = codes >> s.m, codes & (2**s.m - 1)
    sub = np.ldexp(frac.astype(np.float64), s.emin - s.m)
    normal = np.ldexp((2**s.m + frac).astype(np.float64), (field - s.bias - s.m).astype(np.int32))
    return np.where(field == 0, sub, normal)


def _f32_steps(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Each x as float32, moved by k[i] float32 ulps (|k| <= 4; past max gives inf)."""
    v = _f32_array(x)
    toward = np.where(k > 0, np.float32(np.inf), np.float32(-np.inf))
    with np.errstate(over="ignore"):
        for i in range(1, int(np.abs(k).max(initial=0)) + 1):
            v = np.where(np.abs(k) >= i, np.nextafter(v, toward), v)
    return v


def _f32_array(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def _edge_batch32(f: FloatFormat, rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` float32 values, each of one edge kind of EDGE_NAMES (uniformly), either sign."""
    s = Spec.of(f)
    kind = rng.integers(0, len(EDGE_NAMES), size)
    codes = rng.integers(0, s.max_code + 1, size, dtype=np.int64)
    lo = _member_values(f, codes)
    hi = np.where(codes < s.max_code, _member_values(f, np.minimum(codes + 1, s.max_code)),
                  lo + 2.0 ** (f.emax - f.mantissa_bits))
    tie = (lo + hi) / 2
    step = rng.choice(np.array([-3, -2, -1, 1, 2, 3]), size)
    boundary = f.max + 2.0 ** (f.emax - f.mantissa_bits - 1)
    far = np.array([f.max, 2 * f.max, f.max + 2.0 ** (f.emax - f.mantissa_bits),
                    float(np.finfo(np.float32).max)])
    overflow = np.where(rng.random(size) < 0.5,
                        _f32_steps(np.full(size, boundary), rng.integers(-4, 5, size)),
                        _f32_array(far[rng.integers(0, 4, size)]))
    anchors = np.array([f.tiny, f.smallest_subnormal, f.smallest_subnormal / 2,
                        f.tiny - f.smallest_subnormal])
    subnormal = _f32_steps(anchors[rng.integers(0, 4, size)], rng.integers(-3, 4, size))
    special = np.array([0.0, -0.0, np.inf, -np.inf])[rng.integers(0, 4, size)]
    nan = ((rng.random(size) < 0.5).astype(np.uint32) * np.uint32(0x80000000)
           | np.uint32(0x7F800000) | rng.integers(1, 2**23, size, dtype=np.uint32))
    bits = rng.integers(0, 2**32, size, dtype=np.uint32)
    by_kind = {  # EDGE_NAMES, in order
        "ties": _f32_array(tie), "near_ties": _f32_steps(tie, step),
        "overflow_edge": overflow, "subnormal_edge": subnormal,
        "members": _f32_array(lo), "specials": _f32_array(special),
        "nan_payloads": nan.view(np.float32), "float32_bits": bits.view(np.float32)}
    out = np.choose(kind, [by_kind[k] for k in EDGE_NAMES])
    signed = np.isin(kind, [EDGE_NAMES.index(k) for k in (
        "ties", "near_ties", "overflow_edge", "subnormal_edge", "members")])
    flip = signed & (rng.random(size) < 0.5)
    return np.where(flip, -out, out).astype(np.float32)


def float32_batch(fmt: str | FloatFormat, seed: int, size: int = 256) -> np.ndarray:
    """1-d float32 array of `size` edge values (`edge_float32`'s kinds, each kind about
    size/8 times), drawn by NumPy from `seed`."""
    return _edge_batch32(get_format(fmt), np.random.default_rng(seed), size)


def float64_batch(fmt: str | FloatFormat, seed: int, size: int = 256) -> np.ndarray:
    """1-d float64 array of `size` values (`float64_arrays`' kinds, a quarter each):
    double-rounding cases, float32 edges, floats of every magnitude, any bit pattern."""
    f = get_format(fmt)
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 4, size)
    with np.errstate(invalid="ignore"):  # signalling NaNs arrive quieted, as float() does
        edges = _edge_batch32(f, rng, size).astype(np.float64)
    s = Spec.of(f)
    codes = rng.integers(0, s.max_code + 1, size, dtype=np.int64)
    lo = _member_values(f, codes)
    hi = np.where(codes < s.max_code, _member_values(f, np.minimum(codes + 1, s.max_code)),
                  lo + 2.0 ** (f.emax - f.mantissa_bits))
    tie = (lo + hi) / 2
    offset = rng.integers(-3, 4, size) * np.spacing(tie) * np.ldexp(
        1.0, rng.integers(0, 21, size))
    double = np.where(tie != 0, tie + offset, tie)
    # every magnitude float64 has (and +-inf past it), half of them near the format's range
    exponent = np.where(rng.random(size) < 0.5, rng.integers(-1074, 1025, size),
                        rng.integers(f.min_exponent - f.mantissa_bits - 4, f.emax + 5, size))
    with np.errstate(over="ignore"):
        floats = np.ldexp(rng.random(size) + 0.5, exponent)
    bits = rng.integers(0, 2**64, size, dtype=np.uint64).view(np.float64)
    out = np.choose(kind, [double, edges, floats, bits])
    flip = (kind != 1) & (kind != 3) & (rng.random(size) < 0.5)
    return np.where(flip, -out, out)


def float32_batches(fmt: str | FloatFormat, size: int = 256) -> st.SearchStrategy[np.ndarray]:
    """`float32_batch` of a drawn seed."""
    return st.integers(0, 2**32 - 1).map(lambda seed: float32_batch(fmt, seed, size))


def float64_batches(fmt: str | FloatFormat, size: int = 256) -> st.SearchStrategy[np.ndarray]:
    """`float64_batch` of a drawn seed."""
    return st.integers(0, 2**32 - 1).map(lambda seed: float64_batch(fmt, seed, size))


@st.composite
def rounding_arguments(draw: st.DrawFn) -> dict:
    """{rounding, overflow, subnormals, word}: encode's and quantize's ranged arguments over
    their declared ranges (common/arg_ranges.py): any rounding mode, overflow None (the
    format's default) or any policy (some refused by some formats: the same refusal in both
    trees), either subnormals flag, and for stochastic rounding one random word, every
    element's, anywhere in [0, 2^32) (its edges included)."""
    rounding = draw(declared_values(ROUNDING_MODES))
    args = {"rounding": rounding,
            "overflow": draw(st.none() | declared_values(OVERFLOW_POLICIES)),
            "subnormals": draw(st.booleans())}
    if rounding == "stochastic":
        args["word"] = draw(declared_values(RANDOM_WORDS))
    return args
