"""Number formats: reference (integer arithmetic) vs torch (native casts) vs ml_dtypes.

Every assertion names a claim in parity/tolerances.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

import reference.formats as ref
import torch_impl.formats as tim
from parity import strategies
from parity.checks.formats import exact_nearest_even, stochastic_p_value
from parity.compare import assert_claim, holds
from parity.sweep import ML_DTYPES, sweep_range
from parity.tolerances import claim

TORCH_FORMATS = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")
ALL_FORMATS = ("float32", "tf32", *TORCH_FORMATS)
formats = pytest.mark.parametrize("name", ALL_FORMATS)
torch_formats = pytest.mark.parametrize("name", TORCH_FORMATS)


def edge_class(x: float, fmt: ref.FloatFormat) -> str:
    """Which edge an input sits on, for hypothesis.event (shows that edges are reached)."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x) or x == 0:
        return "inf" if math.isinf(x) else "zero"
    a = Fraction(abs(x))
    boundary = Fraction(fmt.max) + Fraction(2) ** (fmt.emax - fmt.mantissa_bits - 1)
    if a >= boundary:
        return "overflow"
    e = max(math.frexp(abs(x))[1] - 1, fmt.min_exponent)
    q = a / Fraction(2) ** (e - fmt.mantissa_bits)
    if q.denominator == 2:
        return "tie"
    return "subnormal" if abs(x) < fmt.tiny else "normal"


def _events(x: np.ndarray, fmt: ref.FloatFormat) -> None:
    for v in x.reshape(-1).tolist():
        event(edge_class(v, fmt))


def _torch(x: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


@formats
def test_range_table_matches_torch_finfo_and_ml_dtypes_exactly(name: str) -> None:
    """Every range property derived from the bits equals torch.finfo's and ml_dtypes.finfo's."""
    fields = ("bits", "eps", "max", "tiny", "smallest_subnormal", "max_exponent",
              "min_exponent", "mantissa_bits", "exponent_bits", "unit_roundoff")
    r, t = ref.FORMATS[name], tim.FORMATS[name]
    assert_claim("formats.ranges", np.array([float(getattr(r, f)) for f in fields]),
                 np.array([float(getattr(t, f)) for f in fields]), f"(reference vs torch, {name})")
    if name in ML_DTYPES:
        fi = ml_dtypes.finfo(ML_DTYPES[name])
        ml = [fi.bits, fi.eps, fi.max, fi.smallest_normal, fi.smallest_subnormal, fi.maxexp,
              fi.minexp, fi.nmant, fi.nexp, float(fi.eps) / 2]
        assert_claim("formats.ranges", np.array([float(getattr(r, f)) for f in fields]),
                     np.array([float(v) for v in ml]), f"(reference vs ml_dtypes, {name})")


@torch_formats
def test_every_bit_pattern_decodes_identically_in_reference_torch_and_ml_dtypes(
    name: str, device: str
) -> None:
    """All 2^8 or 2^16 codes decode to the same float64 in the three libraries."""
    fmt = tim.FORMATS[name]
    codes = np.arange(2**fmt.bits, dtype=ref.FORMATS[name].code_dtype)
    expected = ref.decode(codes, name)
    got_torch = tim.decode(_torch(codes, device), name).cpu().numpy()
    with np.errstate(invalid="ignore"):  # signalling NaN codes raise "invalid" when widened
        got_ml = codes.view(ML_DTYPES[name]).astype(np.float64)
    assert_claim("formats.decode", got_torch, expected, f"(torch, {name})")
    assert_claim("formats.decode", got_ml, expected, f"(ml_dtypes, {name})")


@formats
@given(data=st.data())
def test_encode_float32_matches_torch_bitwise_on_edges(name: str, device: str,
                                                       data: st.DataObject) -> None:
    """Round-to-nearest-even codes of float32 edge inputs equal torch's native cast's."""
    x = data.draw(strategies.float32_arrays(name))
    _events(x, ref.FORMATS[name])
    overflow = tim.DEFAULT_OVERFLOW[name]
    # Codes are compared through each side's own decode (formats.decode proves the decoders
    # equal), so that NaN codes compare as a class.
    expected = tim.decode(tim.encode(_torch(x, device), name), name).cpu().numpy()
    got = ref.decode(ref.encode(x, name, overflow=overflow), name)
    assert_claim("formats.encode_f32", got, expected)


@torch_formats
@given(data=st.data())
def test_encode_float32_matches_ml_dtypes_bitwise_on_edges(name: str,
                                                           data: st.DataObject) -> None:
    """Codes equal ml_dtypes' astype (which gives NaN on float8_e4m3fn overflow)."""
    x = data.draw(strategies.float32_arrays(name))
    _events(x, ref.FORMATS[name])
    overflow = "nan" if name == "float8_e4m3fn" else None
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is the subject
        expected = x.astype(ML_DTYPES[name]).astype(np.float64)
    assert_claim("formats.encode_f32", ref.decode(ref.encode(x, name, overflow=overflow), name),
                 expected)


@formats
@given(data=st.data())
def test_encode_float64_is_correctly_rounded(name: str, device: str,
                                             data: st.DataObject) -> None:
    """float64 inputs round once, as exact rational arithmetic does, in reference and torch."""
    fmt = ref.FORMATS[name]
    x = data.draw(strategies.float64_arrays(name))
    _events(x, fmt)
    oracle = np.array([exact_nearest_even(v, fmt) for v in x.tolist()])
    overflow = "inf" if fmt.convention == "ieee" else "saturate"
    assert_claim("formats.encode_f64_correct", ref.quantize(x, name, overflow=overflow), oracle,
                 "(reference)")
    got_torch = tim.quantize(_torch(x, device), name, overflow=overflow).cpu().numpy()
    assert_claim("formats.encode_f64_correct", got_torch, oracle, "(torch, round to odd)")


def test_double_rounding_example_bfloat16() -> None:
    """1 + 2^-8 + 2^-40 is bf16 1.0078125 when rounded once, 1.0 through float32 (torch)."""
    x = np.array([1 + 2.0**-8 + 2.0**-40])
    torch_cast = torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    assert_claim("formats.encode_f64_correct", ref.quantize(x, "bfloat16"),
                 np.array([exact_nearest_even(float(x[0]), ref.FORMATS["bfloat16"])]))
    assert_claim("formats.encode_f64_via_f32", ref.quantize(x, "bfloat16", via="float32"),
                 torch_cast)
    # The guard that makes the pair meaningful: the two answers really differ.
    assert ref.quantize(x, "bfloat16")[0] == 1.0078125 and torch_cast[0] == 1.0


@torch_formats
@given(data=st.data())
def test_encode_float64_via_float32_matches_torch_native_cast(name: str, device: str,
                                                              data: st.DataObject) -> None:
    """Rounding through float32 reproduces torch's float64 -> low-precision cast bit for bit."""
    x = data.draw(strategies.float64_arrays(name))
    native = _torch(x, device).to(tim.FORMATS[name].dtype).to(torch.float64).cpu().numpy()
    overflow = tim.DEFAULT_OVERFLOW[name]
    assert_claim("formats.encode_f64_via_f32",
                 ref.quantize(x, name, via="float32", overflow=overflow), native)


@formats
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]),
       overflow=st.sampled_from([None, "saturate", "nan"]))
def test_toward_zero_matches_torch_bitwise(name: str, device: str, data: st.DataObject,
                                           dtype: type, overflow: str | None) -> None:
    """Truncation of the significand equals torch's cast-then-step-back, any policy."""
    draw = strategies.float32_arrays if dtype == np.float32 else strategies.float64_arrays
    x = data.draw(draw(name))
    got = ref.quantize(x, name, rounding="toward_zero", overflow=overflow)
    expected = tim.quantize(_torch(x, device), name, rounding="toward_zero", overflow=overflow)
    assert_claim("formats.toward_zero", got, expected.cpu().numpy())


@formats
@given(data=st.data(), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_stochastic_rounding_matches_torch_given_the_same_words(
    name: str, device: str, data: st.DataObject, seed: int, dtype: type
) -> None:
    """With the same 32-bit words, both sides round each element the same way."""
    draw = strategies.float32_arrays if dtype == np.float32 else strategies.float64_arrays
    x = data.draw(draw(name))
    words = ref.draw_random_words(x.shape, np.random.default_rng(seed))
    got = ref.quantize(x, name, rounding="stochastic", random_bits=words)
    expected = tim.quantize(_torch(x, device), name, rounding="stochastic",
                            random_bits=_torch(words.astype(np.int64), device))
    assert_claim("formats.stochastic_bits", got, expected.cpu().numpy())


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn"])
@pytest.mark.parametrize(
    "x", [1 + 2.0**-12 + 2.0**-14, 1 + 3 * 2.0**-11 + 2.0**-20, 0.1, -3.3e-6, 300.3])
def test_stochastic_rounding_is_unbiased(name: str, x: float, device: str) -> None:
    """The mean of n stochastic roundings of x is x, up to the claim's false-failure rate."""
    n = 20_000
    x32 = np.full(n, x, dtype=np.float32)
    rounded = ref.quantize(x32, name, rounding="stochastic", rng=np.random.default_rng(7))
    g = torch.Generator(device=device).manual_seed(7)
    rounded_t = tim.quantize(_torch(x32, device), name, rounding="stochastic", rng=g)
    unbiased = claim("formats.stochastic_unbiased")
    for side, r in (("reference", rounded), ("torch", rounded_t.cpu().numpy())):
        p_value = stochastic_p_value(float(x32[0]), name, r)
        assert holds(unbiased, p_value), f"{side}: p = {p_value:.2e} < {unbiased.bound}"


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_exhaustive_float32_sweep_has_no_mismatch(name: str) -> None:
    """All 2^32 float32 inputs: reference == torch and == ml_dtypes under declared policies."""
    summary = sweep_range(name, 0, 2**32, workers=2)
    assert summary.total == 2**32
    observed = summary.mismatches_torch + summary.mismatches_ml_dtypes
    assert holds(claim("formats.sweep"), observed), summary
