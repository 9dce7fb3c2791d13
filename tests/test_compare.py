"""The comparison helpers (parity/compare.py) fail where a claim is broken and hold exactly at
its boundary, for every claim kind: each test builds a Claim and two arrays by hand, with
the expected observation computed here from the definition, not from the helper."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from parity.compare import (
    RECORD,
    as_numpy,
    assert_claim,
    assert_observed,
    holds,
    in_eps_units,
    max_abs_difference,
    measure,
    mismatches,
    non_members,
)
from parity.tolerances import Claim

REASON = "a hand-made claim for the comparison helpers' own tests"
BITS = Claim(id="formats.t_bits", statement="s", kind="bits", bound=0, reason=REASON)
NAN_CLASS = Claim(id="formats.t_nan", statement="s", kind="nan_class", bound=0, reason=REASON)
ULPS_BF16 = Claim(id="formats.t_ulps", statement="s", kind="ulps", bound=1, reason=REASON,
                  fmt="bfloat16")
ULPS_E4M3 = Claim(id="formats.t_ulps8", statement="s", kind="ulps", bound=1, reason=REASON,
                  fmt="float8_e4m3fn")
EPS = Claim(id="formats.t_eps", statement="s", kind="eps", bound=2, reason=REASON,
            scale="|b|")
STATISTICAL = Claim(id="formats.t_stat", statement="s", kind="statistical", bound=1e-6,
                    reason=REASON)

F32_EPS = 2.0**-23


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def f32_bits(*codes: int) -> np.ndarray:
    return np.array(codes, dtype=np.uint32).view(np.float32)


# -- holds: the boundary of every kind ---------------------------------------------------

@pytest.mark.parametrize(("c", "at_bound", "beyond"), [
    (BITS, 0.0, 1.0),
    (NAN_CLASS, 0.0, 1.0),
    (ULPS_BF16, 1.0, 2.0),
    (EPS, 2.0, math.nextafter(2.0, 3.0)),
])
def test_holds_at_the_bound_and_fails_just_beyond_it(c: Claim, at_bound: float,
                                                     beyond: float) -> None:
    """`observed <= bound` (close: <= 1): equality holds, the next float above fails."""
    assert holds(c, at_bound)
    assert not holds(c, beyond)
    assert not holds(c, math.inf)
    assert not holds(c, math.nan), "a NaN observation must never hold"


def test_the_dropped_kind_is_refused() -> None:
    """close left with the last claim that used it (parity/claims)."""
    with pytest.raises(ValueError, match="is not one of"):
        Claim(id="formats.t_gone", statement="s", kind="close", bound=1, reason=REASON)


# -- statistical ---------------------------------------------------------------------------

def test_statistical_holds_for_p_at_or_above_alpha_and_never_for_nan() -> None:
    """A p-value holds when >= the false-failure probability: the next float below fails."""
    assert holds(STATISTICAL, 1e-6) and holds(STATISTICAL, 1.0)
    assert not holds(STATISTICAL, math.nextafter(1e-6, 0.0))
    assert not holds(STATISTICAL, 0.0)
    assert not holds(STATISTICAL, math.nan)


def test_statistical_bound_must_be_a_probability() -> None:
    """alpha in (0, 1): 0 would never fail, 1 always."""
    for alpha in (0.0, 1.0, 2.0):
        with pytest.raises(ValueError, match="false-failure probability"):
            Claim(id="formats.t_p", statement="s", kind="statistical", bound=alpha,
                  reason=REASON)
    assert STATISTICAL.tolerance == "p >= 1e-06 (false-failure probability)"


def test_statistical_record_keeps_the_smallest_p_and_assert_observed_raises_below_alpha(
        ) -> None:
    """The worst case of a statistical claim is its smallest p-value over every call."""
    RECORD.pop(STATISTICAL.id, None)
    try:
        assert_observed(STATISTICAL, 0.5, 10)
        assert_observed(STATISTICAL, 0.01, 10)
        assert_observed(STATISTICAL, 0.2, 10)
        assert RECORD[STATISTICAL.id].worst == 0.01 and RECORD[STATISTICAL.id].held
        with pytest.raises(AssertionError, match=r"claim formats.t_stat .*observed 1e-07"):
            assert_observed(STATISTICAL, 1e-7, 10)
        assert RECORD[STATISTICAL.id].worst == 1e-7 and not RECORD[STATISTICAL.id].held
        with pytest.raises(ValueError, match="assert_observed"):
            measure(STATISTICAL, np.zeros(1), np.zeros(1))
    finally:
        RECORD.pop(STATISTICAL.id, None)


# -- bits ----------------------------------------------------------------------------------

def test_bits_counts_one_ulp_signed_zeros_and_nan_payloads_as_mismatches() -> None:
    """One ulp apart, +0 vs -0, and two NaNs with different payloads each break `bits`."""
    a = f32_bits(0x3F800000, 0x00000000, 0x7FC00000, 0x40000000)
    b = f32_bits(0x3F800001, 0x80000000, 0x7FC00001, 0x40000000)
    assert mismatches("bits", a, b).tolist() == [True, True, True, False]
    assert measure(BITS, a, b) == 3
    with pytest.raises(AssertionError, match=r"claim formats\.t_bits .*observed 3.*0x3f800001"):
        assert_claim(BITS, actual=a, expected=b)


def test_bits_holds_for_identical_patterns_nan_payloads_included() -> None:
    a = f32_bits(0x3F800000, 0x80000000, 0x7FC00001, 0xFF800000)
    assert measure(BITS, a, a.copy()) == 0
    assert assert_claim(BITS, actual=a, expected=a.copy()) == 0


def test_bits_refuses_different_shapes_and_dtypes() -> None:
    with pytest.raises(AssertionError, match="shapes differ"):
        measure(BITS, f32(1.0, 2.0), f32(1.0))
    with pytest.raises(AssertionError, match="dtypes differ"):
        measure(BITS, f32(1.0), np.array([1.0]))


def test_bits_sees_torch_tensors_of_dtypes_numpy_lacks(device: str) -> None:
    """A bfloat16 tensor compares by its bits (one bf16 ulp apart is one mismatch)."""
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, device=device)
    b = torch.tensor([1.0, 2.0 + 2.0**-6], dtype=torch.bfloat16, device=device)
    assert as_numpy(a).dtype == np.dtype(ml_dtypes.bfloat16)
    assert measure(BITS, a, b) == 1
    assert measure(BITS, a, a.clone()) == 0


# -- nan_class -------------------------------------------------------------------------------

def test_nan_class_counts_nan_against_a_number_and_any_differing_number() -> None:
    a = f32_bits(0x7FC00000, 0x7FC00000, 0x3F800000, 0x00000000)
    b = f32_bits(0x3F800000, 0x7F800000, 0x3F800001, 0x80000000)
    assert mismatches("nan_class", a, b).tolist() == [True, True, True, True]
    assert measure(NAN_CLASS, a, b) == 4
    with pytest.raises(AssertionError, match=r"claim formats\.t_nan"):
        assert_claim(NAN_CLASS, actual=a, expected=b)


def test_nan_class_holds_for_nans_of_any_sign_and_payload() -> None:
    a = f32_bits(0x7FC00000, 0xFFC00001, 0x7F800001, 0x3F800000)
    b = f32_bits(0xFFC00000, 0x7FC00000, 0x7FFFFFFF, 0x3F800000)
    assert measure(NAN_CLASS, a, b) == 0


# -- ulps ------------------------------------------------------------------------------------

def test_ulps_counts_steps_between_members_and_fails_beyond_the_bound() -> None:
    """bfloat16 has 7 mantissa bits: 1 and 1 + 2^-7 are 1 ulp apart, 1 + 2^-6 two."""
    one = f32(1.0, -1.0, 0.0)
    assert measure(ULPS_BF16, one, f32(1.0 + 2.0**-7, -1.0 - 2.0**-7, -0.0)) == 1
    assert measure(ULPS_BF16, one, f32(1.0 + 2.0**-6, -1.0, 0.0)) == 2
    with pytest.raises(AssertionError, match=r"claim formats\.t_ulps .*observed 2"):
        assert_claim(ULPS_BF16, actual=one, expected=f32(1.0 + 2.0**-6, -1.0, 0.0))


def test_ulps_across_zero_counts_both_sides_steps() -> None:
    """-smallest subnormal to +smallest subnormal is 2 ulps (the zeros are one member)."""
    tiny = 2.0**-133  # bfloat16's smallest subnormal: 2^(1 - 127 - 7)
    assert measure(ULPS_BF16, f32(-tiny), f32(tiny)) == 2
    assert measure(ULPS_BF16, f32(-tiny), f32(0.0)) == 1


def test_ulps_refuses_a_non_member_naming_the_claim_side_and_element() -> None:
    """A missing final rounding (a float32 value between two bfloat16 values) must fail,
    not read as 0 ulps: whichever side holds it is named with its flat index."""
    member, outsider = f32(1.0, 2.0), f32(1.0, 2.0 + 2.0**-20)
    with pytest.raises(AssertionError, match=r"formats\.t_ulps: the actual side .*not "
                                             r"members of bfloat16.*flat index 1"):
        measure(ULPS_BF16, outsider, member)
    with pytest.raises(AssertionError, match=r"the expected side .*flat index 1"):
        measure(ULPS_BF16, member, outsider)


def test_ulps_refuses_infinity_in_a_format_without_one() -> None:
    """float8_e4m3fn has no infinity: inf is not a member, 448 (its max) is."""
    assert non_members(f32(448.0, np.inf, -np.inf, np.nan), "float8_e4m3fn").tolist() == [
        False, True, True, False]
    with pytest.raises(AssertionError, match="not members of float8_e4m3fn"):
        measure(ULPS_E4M3, f32(np.inf), f32(448.0))
    assert measure(ULPS_E4M3, f32(448.0), f32(416.0)) == 1


def test_ulps_refuses_different_shapes_dtypes_and_integers() -> None:
    with pytest.raises(AssertionError, match="shapes differ"):
        measure(ULPS_BF16, f32(1.0), f32(1.0, 1.0))
    with pytest.raises(AssertionError, match="dtypes differ"):
        measure(ULPS_BF16, f32(1.0), np.array([1.0]))
    with pytest.raises(AssertionError, match="floating-point"):
        measure(ULPS_BF16, np.array([1], np.int32), np.array([1], np.int32))


def test_ulps_nan_on_one_side_only_is_infinitely_far() -> None:
    assert measure(ULPS_BF16, f32(np.nan, 1.0), f32(np.nan, 1.0)) == 0
    assert measure(ULPS_BF16, f32(np.nan, 1.0), f32(1.0, 1.0)) == math.inf


# -- eps -------------------------------------------------------------------------------------

def test_eps_units_are_the_difference_over_eps_times_scale() -> None:
    """float32: 1 + 2 eps against 1 is 2 eps units of S = 1; in float64 eps is 2^-52."""
    units = in_eps_units(f32(1.0 + 2 * F32_EPS, 4.0), f32(1.0, 4.0 + 16 * F32_EPS), f32(1, 4))
    assert units.tolist() == [2.0, 4.0]
    assert in_eps_units(np.array([1.0 + 2.0**-51]), np.array([1.0]), 1.0).tolist() == [2.0]
    bf = np.array([1.0 + 2.0**-7], ml_dtypes.bfloat16)
    assert in_eps_units(bf, np.array([1.0], ml_dtypes.bfloat16), 1.0).tolist() == [1.0]


def test_eps_holds_at_c_and_fails_one_float_beyond() -> None:
    b = f32(1.0, 2.0)
    assert measure(EPS, f32(1.0 + 2 * F32_EPS, 2.0), b, scale=np.abs(b)) == 2
    assert assert_claim(EPS, actual=f32(1.0 + 2 * F32_EPS, 2.0), expected=b, scale=np.abs(b)) == 2
    assert measure(EPS, f32(1.0 + 3 * F32_EPS, 2.0), b, scale=np.abs(b)) == 3
    with pytest.raises(AssertionError, match=r"claim formats\.t_eps .*observed 3.*max \|a-b\|"):
        assert_claim(EPS, actual=f32(1.0 + 3 * F32_EPS, 2.0), expected=b, scale=np.abs(b))


def test_eps_with_zero_scale_holds_only_for_equal_values() -> None:
    assert measure(EPS, f32(0.0, 1.0), f32(0.0, 1.0), scale=0.0) == 0
    assert measure(EPS, f32(2.0**-149), f32(0.0), scale=0.0) == math.inf


def test_eps_needs_its_scale_and_sees_nan_sets_that_differ() -> None:
    with pytest.raises(ValueError, match=r"t_eps.*\|b\|.*scale="):
        measure(EPS, f32(1.0), f32(1.0))
    assert measure(EPS, f32(np.nan, np.inf), f32(np.nan, np.inf), scale=1.0) == 0
    assert measure(EPS, f32(np.nan), f32(1.0), scale=1.0) == math.inf
    assert measure(EPS, f32(np.inf), f32(-np.inf), scale=1.0) == math.inf
    with pytest.raises(AssertionError, match="dtypes differ"):
        measure(EPS, f32(1.0), np.array([1.0]), scale=1.0)


def test_max_abs_difference_is_the_raw_worst_case() -> None:
    """The report's raw column: max |a-b| over non-NaN pairs, inf when NaN sets differ."""
    assert max_abs_difference(np.array([1.0, 5.0, np.nan]), np.array([1.5, 3.0, np.nan])) == 2
    assert max_abs_difference(np.array([np.inf]), np.array([np.inf])) == 0
    assert max_abs_difference(np.array([np.nan]), np.array([1.0])) == math.inf
    assert max_abs_difference(np.zeros(0), np.zeros(0)) == 0


def test_tolerance_texts_read_as_what_the_bound_means() -> None:
    """The report's and docs/tolerances.md's tolerance column states the inequality."""
    assert EPS.tolerance == "|a-b| <= 2 eps · |b|"
    assert ULPS_BF16.tolerance == "<= 1 ulp of bfloat16"
    assert BITS.tolerance == "bit-identical"
    assert NAN_CLASS.tolerance == "bit-identical, NaN as a class"


# -- which side is which: named, and never the verdict ------------------------------------

def test_assert_claim_takes_the_two_sides_by_name_only() -> None:
    """NOTE [ Which side is expected ]: the positional form of old is a TypeError."""
    a = f32(1.0, 2.0)
    with pytest.raises(TypeError):
        assert_claim(BITS, a, a.copy())  # type: ignore[misc]
    with pytest.raises(TypeError):
        assert_claim(BITS, a, expected=a.copy())  # type: ignore[misc]
    assert assert_claim(BITS, actual=a, expected=a.copy()) == 0


@pytest.mark.parametrize(("c", "a", "b", "scale"), [
    (BITS, f32(1.0, -0.0, 3.0), f32(1.0, 0.0, np.nan), None),
    (NAN_CLASS, f32(np.nan, 1.0, 2.0), f32(-np.nan, 1.5, np.nan), None),
    (ULPS_BF16, f32(1.0, -1.0, 0.0, 2.0), f32(1.0 + 2.0**-6, 1.0, -0.0, 2.0 - 2.0**-7), None),
    (EPS, f32(1.0 + 3 * F32_EPS, 2.0, -4.0), f32(1.0, 2.0 + 4 * F32_EPS, -4.0),
     np.array([1.0, 2.0, 0.5])),
])
def test_every_kind_observes_the_same_worst_case_with_the_sides_swapped(
        c: Claim, a: np.ndarray, b: np.ndarray, scale: np.ndarray | None) -> None:
    """The measurement is symmetric (the scale is passed on its own), so naming a side
    `expected` never changes a verdict; the pairs differ, so the swap is no tautology."""
    observed = measure(c, a, b, scale=scale)
    assert observed > 0
    assert measure(c, b, a, scale=scale) == observed
