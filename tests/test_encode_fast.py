"""encode's fast path (reference/encode_kernels.py) against the statement it speeds up
(reference.formats.encode_stepwise): the same codes, bit for bit, on every edge class, in
every rounding mode and overflow policy, from float32 and float64 input.

The two share only the argument checks (`_prepare`): stepwise decomposes every element into
(sign, W, shift) and rounds W by its own shift; the fast path takes one shift for every
element and a float addition below the smallest normal, in blocks of working arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import reference.formats as ref
from parity import oracles, strategies
from parity.strategies import examples

GENERIC = (ref.FloatFormat("e3m2", 3, 2), ref.FloatFormat("e6m9", 6, 9),
           ref.FloatFormat("e3m4fn", 3, 4, "fn"), ref.FloatFormat("e8m1", 8, 1))
# the other conventions (fnuz, finite float6/float4, unsigned E8M0) beyond the named formats:
# other widths, a bias of its own, a finite format with one exponent bit, unsigned formats
# narrower and wider than E8M0 (10 bits at most: member_edges decodes every code)
GENERIC_OTHER = (ref.FloatFormat("e3m2fnuz", 3, 2, "fnuz"),
                 ref.FloatFormat("e4m5fnuz", 4, 5, "fnuz", exponent_bias=3),
                 ref.FloatFormat("e1m2finite", 1, 2, "finite"),
                 ref.FloatFormat("e5m4finite", 5, 4, "finite"),
                 ref.FloatFormat("e5m0", 5, 0, "unsigned"),
                 ref.FloatFormat("e10m0", 10, 0, "unsigned"))
IEEE_LIKE = (*(f for f in ref.FORMATS.values() if f.convention in ("ieee", "fn")), *GENERIC)
OTHER = (*(f for f in ref.FORMATS.values() if f.convention not in ("ieee", "fn")),
         *GENERIC_OTHER)
TARGETS = (*IEEE_LIKE, *OTHER)  # every convention: the block kernels encode them all
# float32 input to a format as wide as float32 is widened to float64 first (_source): its
# edges are float64 edges
FLOAT32_TARGETS = tuple(f for f in TARGETS if f.mantissa_bits < 23 and f.max_exponent <= 128
                        and f.min_exponent - f.mantissa_bits >= -149)


def _cases(formats: tuple[ref.FloatFormat, ...]) -> pytest.MarkDecorator:
    """(format, input dtype) cases; the generic formats of the other conventions (thousands
    of edges each, about 1 s) run with -m slow only."""
    return pytest.mark.parametrize(
        "fmt, dtype", [pytest.param(f, d, id=f"{f.name}-{d.__name__}",
                                    marks=[pytest.mark.slow] if f in GENERIC_OTHER else [])
                       for d in (np.float32, np.float64) for f in formats
                       if d == np.float64 or f in FLOAT32_TARGETS])


CASES = _cases(TARGETS)


def _policies(fmt: ref.FloatFormat) -> Iterator[tuple[str, str | None, bool]]:
    """Every (rounding, overflow, subnormals) the format accepts, the default policy too."""
    for rounding in ref.ROUNDING_MODES:
        for overflow in (None, *ref.OVERFLOW_POLICIES):
            if overflow in ("inf", "saturate_finite") and fmt.inf_code is None:
                continue
            if overflow == "nan" and fmt.convention == "finite":  # no NaN: it saturates
                continue
            for subnormals in (True, False):
                yield rounding, overflow, subnormals


def _member_words(x: list[float], fmt: ref.FloatFormat) -> list[int]:
    """words_rounding_up for the other conventions, from the format's members: floor(2^32 p),
    p = (|x| - low) / (high - low) between |x|'s neighbouring members (0 outside them)."""
    values = ref.decode(np.arange(2**fmt.bits, dtype=np.uint64).astype(fmt.code_dtype), fmt)
    members = np.unique(np.abs(values[np.isfinite(values)]))  # ascending, 0 where there is one
    counts = []
    for v in x:
        k = int(np.searchsorted(members, abs(v), side="right")) - 1
        if k < 0 or k + 1 >= len(members):
            counts.append(0)
            continue
        low, high = Fraction(float(members[k])), Fraction(float(members[k + 1]))
        counts.append(math.floor((Fraction(abs(v)) - low) / (high - low) * 2**32))
    return counts


def _words(x: np.ndarray, fmt: ref.FloatFormat) -> np.ndarray:
    """Stochastic words at each input's threshold: u < floor(2^32 p) rounds up (oracles), so
    alternately the last word that rounds up and the first that does not."""
    with np.errstate(invalid="ignore"):  # a signalling NaN is quieted on widening
        wide = x.astype(np.float64)
    finite = [v if math.isfinite(v) else 0.0 for v in wide.tolist()]
    counts = np.array([oracles.words_rounding_up(v, fmt) for v in finite] if fmt in IEEE_LIKE
                      else _member_words(finite, fmt), dtype=np.int64)
    below = np.arange(x.size) % 2 == 0
    return np.clip(np.where(below, counts - 1, counts), 0, 2**32 - 1).astype(np.uint32)


def _assert_bit_equal(x: np.ndarray, fmt: ref.FloatFormat, rounding: str,
                      overflow: str | None, subnormals: bool, via: str | None = None,
                      words: np.ndarray | None = None) -> None:
    kw = {"rounding": rounding, "overflow": overflow, "subnormals": subnormals, "via": via}
    if rounding == "stochastic":
        kw["random_bits"] = _words(x, fmt) if words is None else words
    fast, stepwise = ref.encode(x, fmt, **kw), ref.encode_stepwise(x, fmt, **kw)
    assert fast.dtype == stepwise.dtype and fast.shape == stepwise.shape
    if not np.array_equal(fast, stepwise):
        i = np.flatnonzero(fast != stepwise)[:5]
        raise AssertionError(
            f"{fmt.name} {rounding} overflow={overflow} subnormals={subnormals} via={via}: the "
            f"fast path and the stepwise statement differ at input bits "
            f"{[hex(b) for b in x.view(np.uint32 if x.dtype == np.float32 else np.uint64)[i]]}"
            f": fast {[hex(c) for c in fast[i]]}, stepwise {[hex(c) for c in stepwise[i]]}")


def _steps(x: float, k: int, dtype: type) -> float:
    """x moved k ulps of `dtype` (float32 or float64); past max gives inf."""
    v = dtype(x)
    with np.errstate(over="ignore"):
        for _ in range(abs(k)):
            v = np.nextafter(v, dtype(math.inf if k > 0 else -math.inf))
    return float(v)


def edges(fmt: ref.FloatFormat, dtype: type) -> dict[str, np.ndarray]:
    """The edge classes, by name, as `dtype` arrays of both signs: exact ties (among the
    subnormals, at the smallest normal, in the normals, at the top binade, the tie above
    max), one and two ulps of `dtype` either side of each, the overflow boundary and the
    subnormal boundary with their neighbours, signed zeros, infinities, NaN payloads."""
    s = oracles.Spec.of(fmt)
    m = fmt.mantissa_bits
    codes = sorted({0, 1, 2, 2**m - 2, 2**m - 1, 2**m, 2**m + 1, 3 * 2**m + 5,
                    s.max_code - 1, s.max_code})
    lows = [oracles.member_value(fmt, c) for c in codes]
    highs = [oracles.member_value(fmt, c + 1) if c < s.max_code
             else lows[-1] + 2.0 ** (fmt.emax - m) for c in codes]
    ties = [(lo + hi) / 2 for lo, hi in zip(lows, highs, strict=True)]
    boundary = fmt.max + 2.0 ** (fmt.emax - m - 1)
    anchors = [fmt.tiny, fmt.tiny - fmt.smallest_subnormal, fmt.smallest_subnormal,
               fmt.smallest_subnormal / 2, 1.5 * fmt.smallest_subnormal]
    near = [(v, k) for v in ties for k in (-2, -1, 1, 2)]
    uint, top = (np.uint32, 0x7F800000) if dtype == np.float32 else (np.uint64, 0x7FF << 52)
    sign_bit = 1 << (8 * np.dtype(dtype).itemsize - 1)
    quiet = 1 << (22 if dtype == np.float32 else 51)  # the quiet bit
    payloads = [top | quiet, top | 1, top | (quiet - 1), top | quiet | 0x5A5]
    nans = np.array(payloads + [p | sign_bit for p in payloads], dtype=uint).view(dtype)
    with np.errstate(over="ignore"):
        def both(values: list[float]) -> np.ndarray:
            a = np.array(values, dtype=np.float64).astype(dtype)
            return np.concatenate([a, -a])
        classes = {
            "ties": both(ties),
            "near_ties": both([_steps(v, k, dtype) for v, k in near]),
            "overflow_edge": both([_steps(boundary, k, dtype) for k in range(-2, 3)]
                                  + [fmt.max, 2 * fmt.max]),
            "subnormal_edge": both([_steps(v, k, dtype) for v in anchors for k in (-1, 0, 1)]),
            "signed_zeros": np.array([0.0, -0.0], dtype=dtype),
            "infinities": np.array([math.inf, -math.inf], dtype=dtype),
        }
    return classes | {"nan_payloads": nans}


def member_edges(fmt: ref.FloatFormat, dtype: type) -> dict[str, np.ndarray]:
    """`edges` for the other conventions, from the format's own members (every code decoded:
    these formats have at most 16 bits; parity.oracles' exact rounding knows IEEE-like
    layouts only): the midpoints of neighbouring positive members (ties; for E8M0 1.5 * 2^k),
    one and two ulps of `dtype` either side of each, the overflow boundary max + half the
    top spacing with its neighbours, half the smallest positive member with its neighbours,
    signed zeros, infinities and NaN payloads, both signs."""
    codes = np.arange(2**fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
    values = ref.decode(codes, fmt)
    members = np.unique(values[np.isfinite(values) & (values > 0)])  # ascending, positive
    ties = ((members[:-1] + members[1:]) / 2).tolist()  # exact: at most 11 + 10 bits
    boundary = members[-1] + (members[-1] - members[-2]) / 2
    half_smallest = members[0] / 2
    classes = edges(ref.FloatFormat("float32", 8, 23), dtype)  # its specials, not its ties
    with np.errstate(over="ignore"):
        def both(v: list[float]) -> np.ndarray:
            a = np.array(v, dtype=np.float64).astype(dtype)
            return np.concatenate([a, -a])
        return {
            "members": both(members.tolist()),
            "ties": both(ties),
            "near_ties": both([_steps(v, k, dtype) for v in ties for k in (-2, -1, 1, 2)]),
            "overflow_edge": both([_steps(boundary, k, dtype) for k in range(-2, 3)]
                                  + [members[-1], 2 * members[-1]]),
            "subnormal_edge": both([_steps(v, k, dtype) for v in (half_smallest, members[0])
                                    for k in (-1, 0, 1)]),
            "signed_zeros": classes["signed_zeros"], "infinities": classes["infinities"],
            "nan_payloads": classes["nan_payloads"]}


def _edges(fmt: ref.FloatFormat, dtype: type) -> dict[str, np.ndarray]:
    return edges(fmt, dtype) if fmt in IEEE_LIKE else member_edges(fmt, dtype)


@_cases(OTHER)
def test_every_edge_class_of_the_other_conventions_is_reached_as_stated(
        fmt: ref.FloatFormat, dtype: type) -> None:
    """The guard for the other conventions' edges: members encode to themselves, each tie
    goes to one of its two neighbours while one ulp below and above it go to the lower and
    the upper one, the overflow edge reaches max and beyond it, the subnormal edge reaches
    the smallest positive value and (where there is one) zero."""
    e = member_edges(fmt, dtype)
    saturate = {"overflow": "saturate"}

    def value(x: np.ndarray) -> np.ndarray:
        return ref.decode(ref.encode_stepwise(x, fmt, **saturate), fmt)

    members = e["members"][e["members"] > 0]
    assert np.array_equal(value(members), members.astype(np.float64))
    ties = e["ties"][e["ties"] > 0]
    low, high = members[:-1], members[1:]
    assert np.isin(value(ties), np.concatenate([low, high])).all()
    near = e["near_ties"][e["near_ties"] > 0].reshape(-1, 4)  # -2, -1, +1, +2 ulps of a tie
    assert np.array_equal(value(near[:, 1]), low) and np.array_equal(value(near[:, 2]), high)
    beyond = ref.encode_stepwise(np.abs(e["overflow_edge"]), fmt,
                                 overflow="saturate" if fmt.convention == "finite" else "nan")
    assert ref.decode(beyond, fmt).max() == members[-1] or np.isnan(ref.decode(beyond, fmt)).any()
    lows = set(value(np.abs(e["subnormal_edge"])).tolist())
    assert members[0] in lows and (fmt.convention == "unsigned" or 0.0 in lows)


@_cases(IEEE_LIKE)
def test_every_edge_class_is_reached_as_stated(fmt: ref.FloatFormat, dtype: type) -> None:
    """The guard for the test below: ties are exact midpoints, their neighbours are not, the
    overflow boundary has inputs either side of it, the subnormal edge rounds to subnormals
    and the smallest normal, zeros and NaNs carry both signs."""
    e = edges(fmt, dtype)
    positions = {k: [oracles.position(v, fmt) for v in e[k].astype(np.float64).tolist()]
                 for k in ("ties", "near_ties")}
    assert all(p.denominator == 2 for p in positions["ties"])
    assert all(p.denominator != 2 for p in positions["near_ties"])
    s = oracles.Spec.of(fmt)
    boundary = s.max + s.spacing(s.max) / 2
    edge = np.abs(e["overflow_edge"].astype(np.float64))
    assert (edge > boundary).any() and (edge < boundary).any() and (edge == boundary).any()
    rounded = {abs(oracles.round_exact(v, fmt)) for v in e["subnormal_edge"].tolist()}
    assert {0.0, fmt.smallest_subnormal, fmt.tiny} <= rounded
    assert np.signbit(e["signed_zeros"]).tolist() == [False, True]
    assert np.isnan(e["nan_payloads"]).all() and np.signbit(e["nan_payloads"]).any()
    assert len(set(e["nan_payloads"].view(np.uint64 if dtype == np.float64
                                          else np.uint32).tolist())) == 8


@CASES
def test_fast_encode_equals_the_stepwise_statement_on_every_edge_class(
        fmt: ref.FloatFormat, dtype: type) -> None:
    """Every edge class, every rounding mode (stochastic at each input's threshold word),
    every overflow policy, subnormals kept or flushed, and float64 through float32: the fast
    path's codes are the stepwise statement's."""
    x = np.concatenate(list(_edges(fmt, dtype).values()))
    words = _words(x, fmt)  # the same for every policy: computed once
    for rounding, overflow, subnormals in _policies(fmt):
        _assert_bit_equal(x, fmt, rounding, overflow, subnormals, words=words)
        if dtype == np.float64:
            _assert_bit_equal(x, fmt, rounding, overflow, subnormals, via="float32",
                              words=words)


@settings(examples(25))
@given(data=st.data(), fmt=st.sampled_from(TARGETS), dtype=st.sampled_from(["32", "64"]),
       policy=st.integers(0, 2**16), seed=st.integers(0, 2**32 - 1))
def test_fast_encode_equals_the_stepwise_statement_on_drawn_edges(
        data: st.DataObject, fmt: ref.FloatFormat, dtype: str, policy: int, seed: int) -> None:
    """The strategies' edge values (a drawn list and a batch of 512), any policy, stochastic
    words drawn at random: the same codes."""
    if dtype == "32" and fmt in FLOAT32_TARGETS:
        x = np.concatenate([data.draw(strategies.float32_arrays(fmt, max_size=8)),
                            strategies.float32_batch(fmt, seed, 512)])
    else:
        x = np.concatenate([data.draw(strategies.float64_arrays(fmt, max_size=8)),
                            strategies.float64_batch(fmt, seed, 512)])
    options = list(_policies(fmt))
    rounding, overflow, subnormals = options[policy % len(options)]
    via = "float32" if x.dtype == np.float64 and policy % 2 else None
    event(f"{x.dtype} input, {rounding}, overflow={overflow}, via={via}")
    words = ref.draw_random_words(x.shape, np.random.default_rng(seed))
    _assert_bit_equal(x, fmt, rounding, overflow, subnormals, via, words)


@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (2, 3, 4)], ids=str)
def test_fast_encode_equals_the_stepwise_statement_for_any_shape(shape: tuple[int, ...]) -> None:
    """0-d, 1-d and n-d inputs, stochastic words of the same shape: the same codes, in x's
    shape, from both."""
    x = strategies.float32_batch("float16", seed=7, size=int(np.prod(shape))).reshape(shape)
    words = ref.draw_random_words(shape, np.random.default_rng(7))
    for rounding in ref.ROUNDING_MODES:
        kw = {"random_bits": words} if rounding == "stochastic" else {}
        fast = ref.encode(x, "float16", rounding=rounding, **kw)
        stepwise = ref.encode_stepwise(x, "float16", rounding=rounding, **kw)
        assert fast.shape == stepwise.shape == shape and np.array_equal(fast, stepwise)
