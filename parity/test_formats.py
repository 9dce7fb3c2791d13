"""Number formats: reference (integer arithmetic) vs torch (native casts) vs ml_dtypes.

Every assertion names a claim in parity/claims/formats.py; the drivers that run the trees
are in parity/drivers/formats.py, the exact oracles in parity/oracles.py.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

import reference.formats as ref
import torch_impl.formats as tim
from parity import oracles, strategies
from parity.compare import assert_claim, assert_observed
from parity.drivers import formats as drive
from parity.strategies import examples
from parity.sweep import sweep_range, sweep_sample

formats = pytest.mark.parametrize("name", oracles.ALL_FORMATS)
storage_formats = pytest.mark.parametrize("name", oracles.STORAGE_FORMATS)


def edge_class(x: float, fmt: ref.FloatFormat) -> str:
    """Which edge an input sits on, for hypothesis.event (shows that edges are reached)."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x) or x == 0:
        return "inf" if math.isinf(x) else "zero"
    spec = oracles.Spec.of(fmt)
    if abs(x) >= spec.max + spec.spacing(spec.max) / 2:
        return "overflow"
    if oracles.position(x, fmt).denominator == 2:
        return "tie"
    return "subnormal" if abs(x) < fmt.tiny else "normal"


def _events(x: np.ndarray, fmt: ref.FloatFormat) -> None:
    for v in x.reshape(-1).tolist():
        event(edge_class(v, fmt))


# Each example: a short list hypothesis draws value by value (and shrinks), plus a batch of
# BATCH values of the same edge kinds drawn by NumPy from a hypothesis-drawn seed
# (parity/strategies/formats.py says why). EXAMPLES such examples cover more values than 100
# examples of the list alone, at a fraction of the cost.
BATCH = 256
EXAMPLES = 12
EXAMPLES_ALL_POLICIES = 6  # examples of the tests that run both input dtypes x every policy


def test_float16_rounding_matches_torch_cast_bitwise(device: str) -> None:
    """float32 values across float16's range (ties, subnormals, overflow) round to the same
    float16 values in the reference's integer arithmetic as in torch's native cast."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(64) * 2.0 ** rng.integers(-26, 18, 64)).astype(np.float32)  # (64,)
    x[:4] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 65520.0]  # ties to even, overflow to inf
    ref_codes = ref.encode(x, "float16")  # (64,) uint16
    torch_codes = tim.encode(torch.from_numpy(x).to(device), "float16")  # (64,)
    ref_values = ref.decode(ref_codes, "float16")  # (64,) float64
    torch_values = tim.decode(torch_codes, "float16").cpu().numpy()  # (64,) float64
    assert_claim("formats.encode_f32", actual=torch_values, expected=ref_values)
    # the edges were reached: two ties to even and an overflow
    assert ref_values[0] == 1 and ref_values[1] == 1 + 2.0**-9 and ref_values[3] == np.inf


def _float32_inputs(data: st.DataObject, name: str, size: int = BATCH) -> np.ndarray:
    return np.concatenate([data.draw(strategies.float32_arrays(name, max_size=8)),
                           data.draw(strategies.float32_batches(name, size))])


def _float64_inputs(data: st.DataObject, name: str, size: int = BATCH) -> np.ndarray:
    return np.concatenate([data.draw(strategies.float64_arrays(name, max_size=8)),
                           data.draw(strategies.float64_batches(name, size))])


def _inputs(data: st.DataObject, name: str, dtype: type, size: int = BATCH) -> np.ndarray:
    return (_float32_inputs if dtype == np.float32 else _float64_inputs)(data, name, size)


@formats
def test_range_table_matches_torch_finfo_and_ml_dtypes_exactly(name: str) -> None:
    """Every range property derived from the bits equals torch.finfo's and ml_dtypes.finfo's."""
    r = drive.ranges(name)
    assert_claim("formats.ranges", actual=r["torch"], expected=r["reference"],
                 context=f"(torch, {name})")
    if "ml_dtypes" in r:
        assert_claim("formats.ranges", actual=r["reference"], expected=r["ml_dtypes"],
                     context=f"(ml_dtypes, {name})")


@storage_formats
def test_every_bit_pattern_decodes_identically_in_reference_torch_and_ml_dtypes(
    name: str, device: str
) -> None:
    """All 2^8 or 2^16 codes decode to the same float64 in the three libraries."""
    d = drive.decode_every_code(name, device)
    assert_claim("formats.decode", actual=d["torch"], expected=d["reference"],
                 context=f"(torch, {name})")
    assert_claim("formats.decode", actual=d["reference"], expected=d["ml_dtypes"],
                 context=f"(ml_dtypes, {name})")


@formats
@settings(examples(EXAMPLES))
@given(data=st.data())
def test_encode_float32_matches_torch_bitwise_on_edges(name: str, device: str,
                                                       data: st.DataObject) -> None:
    """Round-to-nearest-even codes of float32 edge inputs equal torch's native cast's."""
    x = _float32_inputs(data, name)
    _events(x, ref.FORMATS[name])
    ref_values, torch_values = drive.nearest_vs_torch(x, name, device)
    assert_claim("formats.encode_f32", actual=torch_values, expected=ref_values)


@storage_formats
@settings(examples(EXAMPLES))
@given(data=st.data())
def test_encode_float32_matches_ml_dtypes_bitwise_on_edges(name: str,
                                                           data: st.DataObject) -> None:
    """Codes equal ml_dtypes' astype (which gives NaN on float8_e4m3fn overflow)."""
    x = _float32_inputs(data, name)
    _events(x, ref.FORMATS[name])
    ref_values, ml_values = drive.nearest_vs_ml_dtypes(x, name)
    assert_claim("formats.encode_f32", actual=ref_values, expected=ml_values)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@formats
@settings(examples(EXAMPLES))
@given(data=st.data())
def test_encode_float64_is_correctly_rounded(name: str, device: str,
                                             data: st.DataObject) -> None:
    """float64 inputs round once, as exact rational arithmetic does, in reference and torch."""
    x = _float64_inputs(data, name)
    _events(x, ref.FORMATS[name])
    got_ref, got_torch, oracle = drive.correctly_rounded(x, name, device)
    assert_claim("formats.encode_f64_correct", actual=got_ref, expected=oracle,
                 context="(reference)")
    assert_claim("formats.encode_f64_correct", actual=got_torch, expected=oracle,
                 context="(torch, round to odd)")


def test_double_rounding_example_bfloat16() -> None:
    """1 + 2^-8 + 2^-40 is bf16 1.0078125 when rounded once, 1.0 through float32 (torch)."""
    x = np.array([1 + 2.0**-8 + 2.0**-40])
    once, _, oracle = drive.correctly_rounded(x, "bfloat16")
    twice, torch_cast = drive.via_float32_vs_torch(x, "bfloat16")
    assert_claim("formats.encode_f64_correct", actual=once, expected=oracle)
    assert_claim("formats.encode_f64_via_f32", actual=twice, expected=torch_cast)
    # The guard that makes the pair meaningful: the two answers really differ.
    assert once[0] == 1.0078125 and torch_cast[0] == 1.0


# NOTE [ Double rounding in the libraries ] (reference/formats.py): ml_dtypes casts float64
# through float32 up to 0.6 and rounds it once from 0.7.
ML_DTYPES_VERSION = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])
ML_DTYPES_ROUNDS_FLOAT64_ONCE = ML_DTYPES_VERSION >= (0, 7)


@pytest.mark.parametrize("name", [n for n in oracles.STORAGE_FORMATS if n != "float16"])
@settings(examples(EXAMPLES))
@given(seed=st.integers(0, 2**32 - 1))
def test_ml_dtypes_float64_cast_rounds_as_the_docs_say_for_its_version(name: str,
                                                                        seed: int) -> None:
    """The installed ml_dtypes' float64 cast is the reference's single rounding (0.7 on) or
    its rounding through float32 (up to 0.6), and not the other, on float64 edges that
    include the ties a first rounding to float32 lands on (float16 is NumPy's own cast)."""
    tie = 1 + 2.0 ** -(ref.FORMATS[name].mantissa_bits + 1)  # 1 + half an ulp: a tie
    x = np.concatenate([[tie + 2.0**-40, -tie - 2.0**-40], strategies.float64_batch(name, seed)])
    overflow = "nan" if name == "float8_e4m3fn" else None  # ml_dtypes' policy (NOTE [ float8..)
    once = ref.quantize(x, name, overflow=overflow)
    twice = ref.quantize(x, name, overflow=overflow, via="float32")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is the subject
        got = x.astype(oracles.ML_DTYPES[name]).astype(np.float64)
    documented, other = (once, twice) if ML_DTYPES_ROUNDS_FLOAT64_ONCE else (twice, once)

    def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # bits, NaN as a class
        return (a.view(np.uint64) == b.view(np.uint64)) | (np.isnan(a) & np.isnan(b))

    assert same(got, documented).all(), f"ml_dtypes {ml_dtypes.__version__}, {name}"
    # The guard: the two roundings differ on the first two inputs (and on others in the
    # batch), so the installed ml_dtypes is the one and not the other.
    assert not same(once, twice)[:2].any() and not same(got, other).all()


@storage_formats
@settings(examples(EXAMPLES))
@given(data=st.data())
def test_encode_float64_via_float32_matches_torch_native_cast(name: str, device: str,
                                                              data: st.DataObject) -> None:
    """Rounding through float32 reproduces torch's float64 -> low-precision cast bit for bit."""
    x = _float64_inputs(data, name)
    via_float32, torch_cast = drive.via_float32_vs_torch(x, name, device)
    assert_claim("formats.encode_f64_via_f32", actual=via_float32, expected=torch_cast)


@formats
@settings(examples(EXAMPLES_ALL_POLICIES))
@given(data=st.data())
def test_toward_zero_matches_torch_bitwise(name: str, device: str, data: st.DataObject) -> None:
    """Truncation of the significand equals torch's cast-then-step-back, float32 and float64
    inputs, every overflow policy (each example runs all six)."""
    for x in (_float32_inputs(data, name), _float64_inputs(data, name)):
        for overflow in (None, "saturate", "nan"):
            ref_values, torch_values = drive.toward_zero(x, name, overflow, device)
            assert_claim("formats.toward_zero", actual=torch_values, expected=ref_values,
                         context=f"({x.dtype} input, overflow {overflow})")


def _policies(name: str) -> list[str]:
    return ["saturate", "nan"] + (["inf"] if ref.FORMATS[name].inf_code is not None else [])


@formats
@settings(examples(EXAMPLES_ALL_POLICIES))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_stochastic_rounding_matches_torch_given_the_same_words(
    name: str, device: str, data: st.DataObject, seed: int
) -> None:
    """With the same 32-bit words and overflow policy, both sides round each element alike,
    float32 and float64 inputs, every policy (each example runs them all)."""
    rng = np.random.default_rng(seed)
    for x in (_float32_inputs(data, name), _float64_inputs(data, name)):
        words = ref.draw_random_words(x.shape, rng)
        for overflow in _policies(name):
            ref_values, torch_values = drive.stochastic_same_words(x, name, words, overflow,
                                                                   device)
            assert_claim("formats.stochastic_bits", actual=torch_values, expected=ref_values,
                         context=f"({x.dtype} input, overflow {overflow})")


@formats
@settings(examples(3))
@given(data=st.data())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_rounding_rounds_up_with_exactly_the_right_probability(
    name: str, device: str, data: st.DataObject, dtype: type
) -> None:
    """In both trees the words that round x up number exactly floor(2^32 p), p the exact
    fraction of a spacing above x's toward-zero neighbour: P(up) = p when <= 32 bits drop.
    (The exact oracle costs per value, the bisection's 33 roundings per side per call.)"""
    x = drive.stochastic_domain(_inputs(data, name, dtype, size=64), name)
    assume(x.size > 0)
    fmt = ref.FORMATS[name]
    for v in x.tolist():
        p = oracles.round_up_fraction(v, fmt)
        event("member" if p == 0 else "tie" if p == 0.5 else "between")
        event("2^32 p exact" if (p * 2**32).denominator == 1 else "2^32 p truncated")
        event(edge_class(v, fmt))
    oracle = drive.oracle_words_rounding_up(x, name)
    for side in ("reference", "torch"):
        count, confirmed = drive.words_rounding_up(x, name, side, device, seed=len(x))
        assert_claim("formats.stochastic_unbiased", actual=count, expected=oracle,
                     context=f"({side})")
        # The count is the threshold below which words round up: confirmed at random words.
        assert_claim("formats.stochastic_unbiased", actual=confirmed,
                     expected=np.ones_like(confirmed),
                     context=f"({side}: rounding up is not 'the word is below the count')")


def test_stochastic_rounding_probability_is_exact_on_named_inputs(device: str) -> None:
    """Ties round up with probability exactly 1/2, a bf16 3/4 point with 3/4, a float16
    subnormal quarter-spacing with 1/4, in both trees (guards for the property above)."""
    cases = [("bfloat16", 1 + 2.0**-8, 2**31), ("bfloat16", 1 + 0.75 * 2.0**-7, 3 * 2**30),
             ("float16", 2.0**-26, 2**30), ("float8_e4m3fn", 464.0, 2**31)]
    for name, v, expected in cases:
        x = np.array([v, -v], dtype=np.float32)
        assert_claim("formats.stochastic_unbiased", actual=drive.oracle_words_rounding_up(x, name),
                     expected=np.array([expected, expected]), context=f"(oracle, {name} {v})")
        for side in ("reference", "torch"):
            count, _ = drive.words_rounding_up(x, name, side, device)
            assert_claim("formats.stochastic_unbiased", actual=count,
                         expected=np.array([expected, expected]), context=f"({side}, {name} {v})")


def test_both_trees_keep_one_contract_for_bad_and_good_inputs(device: str) -> None:
    """Same error class for every bad input, the input's shape and the same dtype for every
    good 0-d, 1-d and n-d input, in both trees, as the table declares."""
    outcomes = drive.contract(device)
    labels = sorted({o for _, *row in outcomes for o in row})
    expected, got_ref, got_torch = (np.array([labels.index(row[i]) for row in outcomes])
                                    for i in (1, 2, 3))
    differ = "; ".join(f"{label}: declared {e}, reference {a}, torch {b}"
                       for label, e, a, b in outcomes if not a == b == e)
    assert_claim("formats.contract", actual=got_torch, expected=got_ref, context=differ)
    assert_claim("formats.contract", actual=got_ref, expected=expected, context=differ)
    # Guards: the table holds refusals of both classes and 0-d results that stay 0-d.
    assert {"TypeError", "ValueError"} <= {e for _, e, _, _ in outcomes}
    assert any(e.startswith("() ") for _, e, _, _ in outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("name", oracles.STORAGE_FORMATS)
def test_exhaustive_float32_sweep_has_no_mismatch(name: str) -> None:
    """All 2^32 float32 inputs: reference == torch and == ml_dtypes under declared policies."""
    summary = sweep_range(name, 0, 2**32, workers=2)
    assert summary.total == 2**32
    observed = summary.mismatches_torch + summary.mismatches_ml_dtypes
    assert_observed("formats.sweep", observed, summary.total, str(summary))


@pytest.mark.parametrize("name", oracles.STORAGE_FORMATS)
def test_sampled_float32_sweep_has_no_mismatch(name: str) -> None:
    """2^16 seeded random float32 bit patterns: reference == torch and == ml_dtypes (the
    exhaustive sweep's quick sample; every class of input is drawn at this size)."""
    summary = sweep_sample(name, 1 << 16, seed=3)
    assert summary.total == 1 << 16
    assert summary.by_class.get("nan", 0) > 0 and summary.by_class.get("subnormal", 0) > 0, (
        f"the sample missed a class: {summary.by_class}")
    observed = summary.mismatches_torch + summary.mismatches_ml_dtypes
    assert_observed("formats.sweep", observed, summary.total, str(summary))


def test_float8_e4m3fn_native_overflow_is_the_declared_policy_of_this_torch(device: str) -> None:
    """The version gate itself: torch >= 2.13 saturates e4m3fn overflow, older torch gives NaN
    (NOTE [ float8_e4m3fn overflow ]); the reference reproduces either policy on request."""
    x = np.array([500.0, np.inf, -1e9, 464.0, 465.0], dtype=np.float32)
    native = drive.as_torch(x, device).to(torch.float8_e4m3fn).to(torch.float64).cpu().numpy()
    policy = tim.DEFAULT_OVERFLOW["float8_e4m3fn"]
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    assert policy == ("saturate" if version >= (2, 13) else "nan")
    assert_claim("formats.encode_f32",
                 actual=ref.quantize(x, "float8_e4m3fn", overflow=policy).astype(np.float64),
                 expected=native, context=f"(torch {torch.__version__}, {policy})")
