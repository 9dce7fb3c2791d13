"""The named edge strategies reach the edges they are named after (a guard on the guards)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.formats as ref
from parity import strategies
from parity.oracles import NARROW
from parity.oracles import position as _position
from parity.strategies import examples


@pytest.mark.parametrize("name", NARROW)
@settings(examples(40))
@given(data=st.data())
def test_ties_are_exact_midpoints_and_near_ties_are_not(name: str, data: st.DataObject) -> None:
    """Every `ties` value is a float32 halfway between two members; `near_ties` never is."""
    fmt = ref.FORMATS[name]
    tie = data.draw(strategies.ties(name))
    assert float(np.float32(tie)) == tie
    assert _position(tie, fmt).denominator == 2
    near = data.draw(strategies.near_ties(name))
    assert _position(near, fmt).denominator != 2


@pytest.mark.parametrize("name", NARROW)
@settings(examples(40))
@given(data=st.data())
def test_members_are_fixed_points_of_exact_rounding(name: str, data: st.DataObject) -> None:
    """`members` values are finite, representable, and on the format's grid."""
    fmt = ref.FORMATS[name]
    v = data.draw(strategies.members(name))
    assert math.isfinite(v) and abs(v) <= fmt.max and _position(v, fmt).denominator == 1


@pytest.mark.parametrize("name", NARROW)
@settings(examples(40))
@given(data=st.data())
def test_boundary_strategies_stay_near_their_boundary(name: str, data: st.DataObject) -> None:
    """overflow_edge lies within a few float32 ulps of max + ulp/2 (or is a named far value);
    subnormal_edge within a few float32 ulps of tiny or of the smallest subnormal (or half)."""
    fmt = ref.FORMATS[name]
    boundary = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    v = abs(data.draw(strategies.overflow_edge(name)))
    assert abs(v - boundary) <= 4 * np.spacing(np.float32(boundary)) or v >= fmt.max
    s = abs(data.draw(strategies.subnormal_edge(name)))
    anchors = (fmt.tiny, fmt.smallest_subnormal, fmt.smallest_subnormal / 2,
               fmt.tiny - fmt.smallest_subnormal)
    assert min(abs(s - a) for a in anchors) <= 3 * float(np.spacing(np.float32(fmt.tiny)))


@given(v=strategies.nan_payloads())
def test_nan_payloads_are_nans_with_any_payload(v: np.float32) -> None:
    """Every value drawn is a float32 NaN; quiet and signalling both occur across draws."""
    assert np.isnan(v)


def test_double_rounding_cases_do_break_ties_differently_through_float32() -> None:
    """Among double_rounding_cases, some float64 inputs round differently once vs via float32."""
    seen = []

    @given(x=strategies.double_rounding_cases("bfloat16"))
    def collect(x: float) -> None:
        seen.append(x)

    collect()
    x = np.array(seen)
    once = ref.quantize(x, "bfloat16")
    twice = ref.quantize(x, "bfloat16", via="float32")
    assert np.count_nonzero(once != twice) > 0


def _near_tie(v: float, fmt: ref.FloatFormat) -> bool:
    """v is one to three float32 ulps from a tie of fmt."""
    for toward in (np.float32(np.inf), np.float32(-np.inf)):
        w = np.float32(v)
        for _ in range(3):
            w = np.nextafter(w, toward)
            if np.isfinite(w) and _position(float(w), fmt).denominator == 2:
                return True
    return False


@pytest.mark.parametrize("name", ref.FORMATS)
def test_every_batch_reaches_every_edge_kind(name: str) -> None:
    """float32_batch (what the formats parity tests run most values through) holds, in every
    batch, exact ties (narrow formats: float32's ties need 25 bits) and values a float32 ulp
    or three from one, members, values within 4 float32 ulps of the overflow boundary and
    beyond max, values around tiny and the smallest subnormal, zeros, infinities and NaNs of
    either sign; float64_batch holds float64 inputs that double-round through float32."""
    fmt = ref.FORMATS[name]
    boundary = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    for seed in range(3):
        x = strategies.float32_batch(name, seed)
        assert x.dtype == np.float32 and x.shape == (256,)
        finite = [float(v) for v in x.tolist() if math.isfinite(v)]
        denominators = [_position(v, fmt).denominator for v in finite]
        assert 1 in denominators  # members
        if name in NARROW:
            assert 2 in denominators  # ties
            assert any(_near_tie(v, fmt) for v, d in zip(finite, denominators, strict=True)
                       if d != 2)
        magnitudes = np.abs(x[np.isfinite(x)].astype(np.float64))
        if name in NARROW:  # (float32's boundary is past float32's range: max and inf show it)
            assert np.any(np.abs(magnitudes - boundary)
                          <= 4 * np.spacing(np.float32(boundary)))
            assert np.any(magnitudes > fmt.max)
        assert np.any(magnitudes == fmt.max)
        assert np.any(np.abs(magnitudes - fmt.tiny) <= 3 * np.spacing(np.float32(fmt.tiny)))
        assert np.any((magnitudes > 0) & (magnitudes <= fmt.smallest_subnormal))
        assert np.any(x == 0) and np.any(np.isinf(x)) and np.any(np.isnan(x))
        assert np.any(np.signbit(x[np.isnan(x)])) and not np.all(np.signbit(x[np.isnan(x)]))
        assert np.any(np.signbit(x[np.isfinite(x)])) and np.any(x[np.isfinite(x)] > 0)
        if name in NARROW:
            y = strategies.float64_batch(name, seed)
            with np.errstate(over="ignore", invalid="ignore"):
                once = ref.quantize(y, name)
                twice = ref.quantize(y, name, via="float32")
            differ = (once != twice) & ~(np.isnan(once) & np.isnan(twice))
            assert np.count_nonzero(differ) > 0
