"""reference.fp8_scaling against its own docstring: the scalar pseudocode of current scaling
and of TE's delayed update, compiled as it stands and run on Python floats (f32 by NumPy,
fp8 by ml_dtypes), element by element against the vectorized code; and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from pseudocode import f32, pseudocode

from common.fp8_recipes import AMAX_EPS, recipe_format
from parity.compare import numpy_dtype
from parity.strategies import examples, fp8_amaxes, fp8_histories, fp8_tensors
from reference import fp8_scaling as rfp8
from reference.formats import get_format

FLT_MAX = float.fromhex("0x1.fffffep127")


def _pseudocode(name: str, fp8: type | None = None):  # type: ignore[no-untyped-def]
    """The function `name` written in reference/fp8_scaling.py's docstring, compiled."""
    return pseudocode(rfp8.__doc__, name, AMAX_EPS=AMAX_EPS, FLT_MAX=FLT_MAX, fmax=_fmax,
                      fp8=(lambda v: float(fp8(np.float32(v)))) if fp8 else None)


def _fmax(a: float, b: float) -> float:
    """C's fmaxf: the number when one side is NaN."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def _assert_same_bits_nan_as_a_class(got: np.ndarray, want: np.ndarray, context: object
                                     ) -> None:
    """The same NaN positions, and the same bits everywhere else (signed zeros included)."""
    nan = np.isnan(got.astype(np.float64))
    assert np.array_equal(nan, np.isnan(want.astype(np.float64))), context
    assert np.array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8)), context


CURRENT_SCALE = _pseudocode("current_scale")
DELAYED_UPDATE = _pseudocode("delayed_update")


@given(case=fp8_amaxes())
@settings(examples(80))
def test_amax_to_scale_is_the_docstring_current_scale(case: tuple[str, np.ndarray]) -> None:
    """Every amax (0, inf, NaN, subnormal, FLT_MAX among them), both formats, with and without
    power-of-2 rounding: the pseudocode's scale, bit for bit."""
    edge, amax = case
    event(edge)
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        for power_of_2 in (False, True):
            got = rfp8.amax_to_scale(amax, fmt, power_of_2)
            want = np.array([CURRENT_SCALE(float(a), get_format(fmt).max, power_of_2)
                             for a in amax], np.float32)
            _assert_same_bits_nan_as_a_class(got, want, (fmt, power_of_2, amax))


@given(case=fp8_tensors())
@settings(examples(60))
def test_current_scaling_is_the_docstring_cast_element_by_element(case: tuple) -> None:
    """Each element: current_cast(x, scale, fp8_max) of the pseudocode with the code's scale
    (itself held to current_scale above), the fp8 rounding by ml_dtypes."""
    x, fmt, axis, power_of_2 = case
    cast = _pseudocode("current_cast", numpy_dtype(fmt).type)
    data, scale = rfp8.current_scaling(x, fmt, axis, power_of_2)
    s = np.broadcast_to(scale, x.shape)
    fp8_max = get_format(fmt).max
    want = np.array([cast(float(v), float(sv), fp8_max) for v, sv in
                     zip(x.reshape(-1), s.reshape(-1), strict=True)]).reshape(x.shape)
    _assert_same_bits_nan_as_a_class(data, want.astype(data.dtype), (fmt, axis, x))


@given(case=fp8_histories())
@settings(examples(80))
def test_delayed_update_is_the_docstring_update_per_scale(case: dict) -> None:
    """Each scale's column through one update: the pseudocode's history and scale, bits (NaNs
    included: they are copied, never made)."""
    h, s, fmt, margin, algo = (case["history"], case["scale"], case["fmt"], case["margin"],
                               case["algo"])
    new_h, new_s = rfp8.delayed_update(h, s, fmt, margin, algo)
    for j in range(h.shape[1]):
        want_h, want_s = DELAYED_UPDATE([float(v) for v in h[:, j]], float(s[j]),
                                        get_format(fmt).max, margin, algo)
        assert np.array_equal(new_h[:, j].view(np.uint32),
                              np.array(want_h, np.float32).view(np.uint32)), (h[:, j], want_h)
        assert new_s[j].view(np.uint32) == np.float32(want_s).view(np.uint32), (h[:, j], s[j])
    event(f"slot 0 zero: {bool((h[0] == 0).any())}, NaN: {bool(np.isnan(h).any())}")


def test_f32_helper_rounds_nearest_even_and_to_inf_at_the_overflow_edge() -> None:
    """The pseudocode's f32: nearest even below, FLT_MAX + half an ulp ties to inf."""
    assert f32(FLT_MAX) == FLT_MAX
    assert f32(float.fromhex("0x1.fffffefffffffp127")) == FLT_MAX
    assert f32(float.fromhex("0x1.ffffffp127")) == math.inf
    assert f32(-float.fromhex("0x1.ffffffp127")) == -math.inf
    assert f32(1 + 2.0**-24) == 1.0 and f32(1 + 3 * 2.0**-24) == 1 + 2.0**-22


def test_bad_input_is_refused_naming_the_problem() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="fmt must be one of"):
        rfp8.current_scaling(x, "float16")
    with pytest.raises(ValueError, match="axis 2 out of range"):
        rfp8.tensor_amax(x, 2)
    with pytest.raises(ValueError, match="empty tensor"):
        rfp8.tensor_amax(np.ones((0, 3), np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        rfp8.tensor_amax(np.ones(3, np.int32))
    h, s = np.zeros((4, 2), np.float32), np.ones(2, np.float32)
    with pytest.raises(ValueError, match="algo must be one of"):
        rfp8.delayed_update(h, s, "float8_e4m3fn", algo="mean")
    with pytest.raises(TypeError, match="margin must be an int"):
        rfp8.delayed_update(h, s, "float8_e4m3fn", margin=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"margin must be in \[-100, 100\]"):
        rfp8.delayed_update(h, s, "float8_e4m3fn", margin=200)
    with pytest.raises(ValueError, match="history must be"):
        rfp8.delayed_update(h, np.ones(3, np.float32), "float8_e4m3fn")
    with pytest.raises(ValueError, match="order must be"):
        rfp8.delayed_scale(s, s, "float8_e4m3fn", order="docs")
    with pytest.raises(ValueError, match="recipe must be one of"):
        recipe_format("E5M2", True)
