"""reference.formats against its own oracles: format identities, exact arithmetic, facts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import reference.encode_kernels as kernels
import reference.formats as ref
from parity import oracles, strategies, ulps
from parity.strategies import examples

# The IEEE and fn formats, whose identities these tests state; the fnuz, finite and unsigned
# ones have their own in tests/test_small_formats.py.
IEEE_FN = tuple(f for f in ref.FORMATS.values() if f.convention in ("ieee", "fn"))
NAMED = tuple(f.name for f in IEEE_FN)
GENERIC = (ref.FloatFormat("e3m2", 3, 2), ref.FloatFormat("e6m9", 6, 9),
           ref.FloatFormat("e3m4fn", 3, 4, "fn"), ref.FloatFormat("e8m1", 8, 1))


@pytest.mark.parametrize("fmt", [*IEEE_FN, *GENERIC], ids=str)
def test_format_identities(fmt: ref.FloatFormat) -> None:
    """ml_dtypes' finfo identities hold for every format, named or generic."""
    assert fmt.mantissa_bits + fmt.exponent_bits + 1 == fmt.bits
    assert fmt.eps == 2.0 ** -fmt.mantissa_bits and fmt.unit_roundoff == fmt.eps / 2
    assert fmt.tiny == 2.0**fmt.min_exponent
    assert fmt.smallest_subnormal == fmt.tiny * fmt.eps
    # 2**max_exponent is not finite: it rounds to inf (or saturates/NaNs in fn formats).
    too_big = np.array([2.0**fmt.max_exponent])
    assert ref.encode(too_big, fmt, overflow="nan" if fmt.convention == "fn" else "inf")[0] & \
        (2 ** (fmt.bits - 1) - 1) > fmt.max_code
    # max is the largest finite: it survives, and its successor in the encoding is not finite.
    assert ref.quantize(np.array([fmt.max]), fmt)[0] == fmt.max
    assert math.isinf(ref.decode(np.array([fmt.max_code + 1]), fmt)[0]) or \
        math.isnan(ref.decode(np.array([fmt.max_code + 1]), fmt)[0])
    # Half the smallest subnormal is a tie between 0 and it: ties to even give 0.
    assert ref.quantize(np.array([fmt.smallest_subnormal / 2]), fmt)[0] == 0.0
    assert ref.quantize(np.array([fmt.smallest_subnormal * 0.75]), fmt)[0] == \
        fmt.smallest_subnormal


@pytest.mark.parametrize("fmt", [f for f in IEEE_FN if f.bits <= 16] + list(GENERIC),
                         ids=str)
def test_finite_count_and_decode_encode_roundtrip_over_every_code(fmt: ref.FloatFormat) -> None:
    """Every code decodes exactly, encodes back to itself (NaNs to NaN), counts as stated."""
    codes = np.arange(2**fmt.bits, dtype=np.uint64).astype(fmt.code_dtype)
    values = ref.decode(codes, fmt)
    assert np.count_nonzero(np.isfinite(values)) == fmt.finite_count
    back = ref.encode(values, fmt, overflow="inf" if fmt.convention == "ieee" else "nan")
    finite = np.isfinite(values) | np.isinf(values)
    assert np.array_equal(back[finite], codes[finite])
    assert np.all(np.isnan(ref.decode(back[~finite], fmt)))
    # The encoding is monotone: positive codes in order are increasing values.
    positive = values[: 2 ** (fmt.bits - 1)]
    ordered = positive[~np.isnan(positive)]
    assert np.all(np.diff(ordered) > 0)


def test_float16_facts_every_course_teaches() -> None:
    """1e-8 underflows to 0, 70000 overflows to inf, 65504 survives, 1 + 2^-11 ties to 1."""
    x = np.array([1e-8, 70000.0, 65504.0, 1 + 2.0**-11, 1 + 2.0**-10, 65520.0, 65519.99])
    q = ref.quantize(x, "float16")
    assert q.tolist() == [0.0, math.inf, 65504.0, 1.0, 1 + 2.0**-10, math.inf, 65504.0]


def test_bfloat16_keeps_float32_range_with_less_precision() -> None:
    """bf16 holds 1e38 and 1e-38 (fp16 cannot), but 1 + 2^-8 rounds to 1."""
    x = np.array([1e38, 1e-38, 1 + 2.0**-8], dtype=np.float32)
    q = ref.quantize(x, "bfloat16")
    assert np.isfinite(q[0]) and q[1] > 0 and q[2] == 1.0
    assert np.isinf(ref.quantize(x[:1], "float16")[0]) and ref.quantize(x[1:2], "float16")[0] == 0


def test_float8_e4m3fn_saturates_by_default_and_gives_nan_on_request() -> None:
    """500 and inf give 448 by default (recent torch), NaN with overflow='nan'; 464 ties to 448."""
    x = np.array([500.0, np.inf, -np.inf, 464.0, 465.0], dtype=np.float32)
    assert ref.quantize(x, "float8_e4m3fn").tolist() == [448.0, 448.0, -448.0, 448.0, 448.0]
    q = ref.quantize(x, "float8_e4m3fn", overflow="nan")
    assert np.isnan(q[[0, 1, 2, 4]]).all() and q[3] == 448.0


@given(x=strategies.float32_arrays("bfloat16"), name=st.sampled_from(NAMED))
def test_quantize_is_idempotent_monotone_and_sign_symmetric(x: np.ndarray, name: str) -> None:
    """q(q(x)) == q(x); x <= y implies q(x) <= q(y); q(-x) == -q(x); for every rounding mode."""
    for rounding in ("nearest_even", "toward_zero"):
        q = ref.quantize(x, name, rounding=rounding)
        assert np.array_equal(ref.quantize(q, name, rounding=rounding), q, equal_nan=True)
        assert np.array_equal(ref.quantize(-x, name, rounding=rounding), -q, equal_nan=True)
        order = np.argsort(x[~np.isnan(x)], kind="stable")
        ranked = q[~np.isnan(x)][order]
        assert np.all(ranked[1:] >= ranked[:-1])


@given(x=strategies.float32_arrays("float16"), name=st.sampled_from(NAMED),
       seed=st.integers(0, 2**32 - 1))
def test_stochastic_rounding_picks_a_neighbour(x: np.ndarray, name: str, seed: int) -> None:
    """Each stochastic result is the toward-zero result or the next member away from zero."""
    lo = ref.quantize(x, name, rounding="toward_zero", overflow="inf" if name != "float8_e4m3fn"
                      else "nan")
    q = ref.quantize(x, name, rounding="stochastic", rng=np.random.default_rng(seed),
                     overflow="inf" if name != "float8_e4m3fn" else "nan")
    fmt = ref.FORMATS[name]
    lo_codes = ref.encode(lo, fmt, overflow="inf" if fmt.inf_code else "nan")
    q_codes = ref.encode(q, fmt, overflow="inf" if fmt.inf_code else "nan")
    step = (q_codes.astype(np.int64) - lo_codes.astype(np.int64))
    finite = np.isfinite(x)
    assert np.all((step[finite] == 0) | (step[finite] == 1) | np.isnan(q[finite]))


def test_stochastic_words_decide_exactly_as_documented() -> None:
    """x = 1 + 3/4 bf16 ulp rounds up iff the word is below 3/4 * 2^32 (NOTE in formats.py)."""
    x = np.full(4, 1 + 0.75 * 2.0**-7, dtype=np.float32)
    words = np.array([0, 3 * 2**30 - 1, 3 * 2**30, 2**32 - 1], dtype=np.uint32)
    q = ref.quantize(x, "bfloat16", rounding="stochastic", random_bits=words)
    assert q.tolist() == [1 + 2.0**-7, 1 + 2.0**-7, 1.0, 1.0]


def test_subnormals_false_flushes_subnormal_results_to_signed_zero() -> None:
    """With subnormals=False a result below tiny becomes +-0; tiny itself stays."""
    f16 = ref.FORMATS["float16"]
    x = np.array([f16.tiny / 2, -f16.smallest_subnormal, f16.tiny, f16.tiny * 0.9999999])
    q = ref.quantize(x, "float16", subnormals=False)
    assert q.tolist() == [0.0, -0.0, f16.tiny, f16.tiny]
    assert math.copysign(1, q[1]) == -1


def test_generic_formats_round_like_fractions() -> None:
    """A 6-bit e3m2 format: its members, ties to even, overflow and subnormals by hand."""
    e3m2 = GENERIC[0]  # bias 3: tiny 0.25, smallest subnormal 0.0625, max 14
    assert (e3m2.bias, e3m2.tiny, e3m2.smallest_subnormal, e3m2.max) == (3, 0.25, 0.0625, 14.0)
    # Ties: 1.5 and 2.5 smallest subnormals, 1 + 1/8, 1 + 3/8, 13 (spacing 2 above 8);
    # 15 is the overflow tie, and 14 = 1.11b * 2^3 is odd, so it rounds up to inf.
    x = np.array([0.09375, 0.15625, 1.125, 1.375, 13.0, 14.5, 15.0])
    assert ref.quantize(x, e3m2).tolist() == [0.125, 0.125, 1.0, 1.5, 12.0, 14.0, math.inf]


@given(x=strategies.float32_arrays("float16", max_size=64), name=st.sampled_from(NAMED),
       rounding=st.sampled_from(ref.ROUNDING_MODES), block=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_encode_in_blocks_gives_the_codes_of_the_whole_array(
        x: np.ndarray, name: str, rounding: str, block: int, seed: int) -> None:
    """NOTE [ Encoding in blocks ]: any block size gives the same codes, random words
    included (each block reads its own slice of them), for n-d arrays too."""
    words = ref.draw_random_words(x.shape, np.random.default_rng(seed))
    kw = {"random_bits": words} if rounding == "stochastic" else {}
    whole = ref.encode(x, name, rounding=rounding, **kw)
    saved, kernels.BLOCK = kernels.BLOCK, block
    try:
        blocked = ref.encode(x, name, rounding=rounding, **kw)
        blocked_2d = ref.encode(x[: x.size // 2 * 2].reshape(2, -1), name, rounding=rounding,
                                **({"random_bits": words[: x.size // 2 * 2].reshape(2, -1)}
                                   if kw else {}))
    finally:
        kernels.BLOCK = saved
    assert np.array_equal(blocked, whole)
    assert np.array_equal(blocked_2d.reshape(-1), whole[: x.size // 2 * 2])


SMALL = [f for f in IEEE_FN if f.bits <= 16] + list(GENERIC)


@pytest.mark.parametrize("fmt", SMALL, ids=str)
@settings(examples(40))
@given(data=st.data())
def test_ulp_distance_counts_nextafter_steps_between_members(fmt: ref.FloatFormat,
                                                             data: st.DataObject) -> None:
    """ulp_distance(a, b) is the difference of a's and b's ranks among all members in order
    (oracles.member_ranks, +0 and -0 one rank), for any two members, infinities included."""
    values, ranks = oracles.member_ranks(fmt)
    pairs = data.draw(st.lists(st.tuples(st.integers(0, values.size - 1),
                                         st.integers(0, values.size - 1)),
                                min_size=1, max_size=64))
    i, j = np.array(pairs).T
    a, b = values[i], values[j]
    a = np.where((a == 0) & data.draw(st.booleans()), -0.0, a)  # either zero, either side
    assert np.array_equal(ulps.ulp_distance(a, b, fmt), np.abs(ranks[i] - ranks[j]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(bits=st.integers(0, 2**64 - 1), steps=st.integers(-300, 300))
def test_ulp_distance_counts_numpy_nextafter_steps_in_float32_and_float64(
        dtype: type, bits: int, steps: int) -> None:
    """Walking k times with np.nextafter from any finite value gives ulp_distance |k| (the
    steps that moved: the walk stops at +-inf)."""
    uint = np.uint32 if dtype == np.float32 else np.uint64
    start = np.array([bits % 2 ** (8 * np.dtype(dtype).itemsize)], dtype=uint).view(dtype)
    assume(np.isfinite(start[0]))
    end, moved = start.copy(), 0
    with np.errstate(over="ignore"):  # walking off the top reaches inf, still a member
        for _ in range(abs(steps)):
            step = np.nextafter(end, dtype(np.inf if steps > 0 else -np.inf))
            moved += int(step[0] != end[0])  # (nextafter stays put at +-inf)
            end = step
    name = "float32" if dtype == np.float32 else "float64"
    assert ulps.ulp_distance(start, end, name)[0] == moved


@pytest.mark.parametrize(
    "a, b, fmt, words",
    [
        (np.array([1.0, np.nan]), np.array([1.0, 1.0]), "bfloat16", r"a\[1\] = nan is NaN"),
        (np.array([1.0]), np.array([np.nan]), "float16", "members of float16.*b.* is NaN"),
        (np.array([[1.0, 1.001]]), np.ones((1, 2)), "bfloat16",
         r"bfloat16.*a\[0, 1\] = 1.001 is not exactly representable"),
        (np.array([np.inf]), np.array([448.0]), "float8_e4m3fn", "not exactly representable"),
        (np.array(1 + 2.0**-30), np.array(1.0), "float32", "float32.*a = 1.0000000009"),
        (np.ones(2), np.ones(3), "float16", "one shape"),
    ],
)
def test_ulp_distance_refuses_nan_and_non_members_naming_the_first(
        a: np.ndarray, b: np.ndarray, fmt: str, words: str) -> None:
    """A NaN or a value the format cannot hold is a ValueError naming it and the format: a
    distance counted after rounding would hide a missing rounding."""
    with pytest.raises(ValueError, match=words):
        ulps.ulp_distance(a, b, fmt)


def test_is_member_means_encode_then_decode_gives_the_value_back() -> None:
    """Members: the format's values, +-0, +-inf in IEEE formats; not NaN, not in-between."""
    x = np.array([1.0, 1 + 2.0**-7, 1 + 2.0**-8, -0.0, np.inf, np.nan, 2.0**-133, 2.0**-134])
    assert ulps.is_member(x, "bfloat16").tolist() == [True, True, False, True, True, False,
                                                      True, False]
    assert not ulps.is_member(np.array([np.inf]), "float8_e4m3fn")[0]


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: ref.get_format("float12"), ValueError, "unknown format"),
        (lambda: ref.quantize(np.array([1, 2]), "float16"), TypeError, "floating-point"),
        (lambda: ref.quantize(np.array([1.0], dtype=np.float16), "float16"), TypeError,
         "float32 or float64"),
        (lambda: ref.quantize(np.array([1.0]), "float16", rounding="up"), ValueError,
         "nearest_even, toward_zero, stochastic"),
        (lambda: ref.quantize(np.array([1.0]), "float16", rounding="stochastic"), ValueError,
         "exactly one of rng="),
        (lambda: ref.quantize(np.array([1.0]), "float16", overflow="wrap"), ValueError,
         "inf, saturate, nan"),
        (lambda: ref.quantize(np.array([1.0]), "float8_e4m3fn", overflow="inf"), ValueError,
         "has no infinity"),
        (lambda: ref.quantize(np.array([1.0], dtype=np.float32), ref.FloatFormat("w", 11, 30)),
         ValueError, "do not all fit"),
        (lambda: ref.FloatFormat("huge", 12, 60), ValueError, "exact in float64"),
        (lambda: ref.decode(np.array([1.0]), "float16"), TypeError, "integer codes"),
        (lambda: ref.decode(np.array([2**16]), "float16"), ValueError, "out of range"),
    ],
)
def test_bad_input_gets_a_clear_error(call: object, error: type, words: str) -> None:
    """Unknown formats, non-float input, unknown modes and missing generators are named."""
    with pytest.raises(error, match=words):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float8_e5m2",
                                  "float8_e4m3", "float8_e3m4", "float8_e4m3fn",
                                  "float8_e4m3fnuz", "float6_e2m3fn"])
def test_toward_zero_carries_finite_overflow_to_max_and_keeps_infinities(name: str) -> None:
    """IEEE 754-2019 7.4 (roundTowardZero carries all overflows to the largest finite number)
    and 5.4.2 (an infinity converts exactly): by default, toward_zero turns a finite x beyond
    max into +-max and keeps +-inf infinite where the format has an infinity; without one,
    +-inf saturates too. Explicit overflow="saturate" still sends +-inf to +-max."""
    fmt = ref.FORMATS[name]
    big = min(float(fmt.max) * 4, float(np.finfo(np.float64).max))
    x = np.array([np.inf, -np.inf, big, -big], np.float64)
    got = ref.quantize(x, name, rounding="toward_zero")
    infinite = fmt.inf_code is not None
    want = [np.inf, -np.inf] if infinite else [fmt.max, -fmt.max]
    assert got.tolist() == [*want, fmt.max, -fmt.max]
    saturated = ref.quantize(x, name, rounding="toward_zero", overflow="saturate")
    assert saturated.tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max]
    if not infinite:
        with pytest.raises(ValueError, match="has no infinity"):
            ref.quantize(x, name, rounding="toward_zero", overflow="saturate_finite")
