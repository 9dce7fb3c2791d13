"""The small formats: reference vs ml_dtypes vs torch (where it casts), measured on
ml_dtypes 0.7 and torch 2.7 to 2.14.

Every assertion names a claim in parity/claims/formats_small.py; the drivers are in
parity/drivers/formats_small.py. The declared differences are measured ones: on a version
they were not measured on, they still run, and a failure names that version.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.formats as ref
from parity import oracles
from parity.compare import assert_claim, assert_observed
from parity.drivers import formats_small as drive
from parity.strategies import examples
from parity.sweep import sweep_range, sweep_sample
from parity.sweep_small import (
    class_edges,
    overflow_bound,
    range_classes,
    small_classes,
    torch_e8m0_codes,
)

small = pytest.mark.parametrize("name", oracles.SMALL_FORMATS)
# the formats the installed torch casts to (torch 2.6 has no float8_e8m0fnu)
TORCH_HAS = tuple(name for name in oracles.TORCH_CASTS if hasattr(torch, name))
torch_casts = pytest.mark.parametrize("name", TORCH_HAS)
# torch's casts to float8_e4m3fnuz, e5m2fnuz and e8m0fnu are the same on 2.7.1, 2.8.0, 2.11.0,
# 2.12.0, 2.12.1 and 2.13.0 (measured: every float32 pattern below 2^24 of each sign, every
# 61st one above); 2.6 has no float8_e8m0fnu. finfo(float8_e5m2fnuz) is the same on 2.6.0 too.
# The declared differences below state torch's and ml_dtypes' own behaviour (their claims'
# Claim.library): measured on the versions the claims name, they run on every other version
# too, where the report names the version beside them, held or failed (parity.claims.VERIFIED).
HAS_E8M0 = pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"),
                              reason="torch 2.6 has no float8_e8m0fnu (from 2.7)")


def _codes_as_values(codes: np.ndarray, name: str) -> np.ndarray:
    """Codes as ml_dtypes' values, so NaN codes compare as a class and zeros by sign."""
    return drive.ml_values(name)[codes.astype(np.int64)]


@small
def test_range_table_matches_ml_dtypes_and_torch_finfo(name: str) -> None:
    fmt = ref.FORMATS[name]
    fields = [f for f in oracles.RANGE_FIELDS if f != "unit_roundoff"]
    ours = np.array([float(getattr(fmt, f)) for f in fields])
    fi = ml_dtypes.finfo(oracles.ML_DTYPES[name])
    theirs = np.array([float(getattr(fi, oracles.ML_FINFO_NAMES[f])) for f in fields])
    assert_claim("formats.small_ranges", actual=ours, expected=theirs,
                 context=f"(ml_dtypes, {name})")
    v = drive.ml_values(name)
    counts = np.array([fmt.finite_count, fmt.nan_count, 2**fmt.bits])
    assert_claim("formats.small_ranges", actual=counts,
                 expected=np.array([np.isfinite(v).sum(), np.isnan(v).sum(), v.size]),
                 context=f"(counts, {name})")
    if name in TORCH_HAS and name != "float8_e5m2fnuz":
        tf = torch.finfo(getattr(torch, name))
        assert_claim("formats.small_ranges", actual=np.array([tf.bits, tf.eps, tf.max, tf.tiny]),
                     expected=np.array([fmt.bits, fmt.eps, fmt.max, fmt.tiny]),
                     context=f"(torch.finfo, {name})")


def test_torch_finfo_of_e5m2fnuz_has_e4m3fnuz_eps() -> None:
    fmt = ref.FORMATS["float8_e5m2fnuz"]
    tf = torch.finfo(torch.float8_e5m2fnuz)
    one = torch.tensor([1.0]).to(torch.float8_e5m2fnuz).view(torch.uint8)
    after_one = (one + 1).view(torch.float8_e5m2fnuz).float().item()
    # torch's own values are spaced eps apart at 1 (the reference's), its finfo says half that
    assert_claim("formats.torch_finfo_e5m2fnuz", actual=np.array([after_one - 1.0]),
                 expected=np.array([fmt.eps]))
    assert_claim("formats.torch_finfo_e5m2fnuz", actual=np.array([tf.eps]),
                 expected=np.array([ref.FORMATS["float8_e4m3fnuz"].eps]))
    assert_claim("formats.torch_finfo_e5m2fnuz", actual=np.array([tf.max, tf.tiny, tf.bits]),
                 expected=np.array([fmt.max, fmt.tiny, fmt.bits]))


@small
def test_every_code_decodes_alike(name: str) -> None:
    codes = np.arange(2 ** ref.FORMATS[name].bits, dtype=np.uint8)
    ours = ref.decode(codes, name)
    assert_claim("formats.small_decode", actual=ours, expected=drive.ml_values(name),
                 context=f"(ml_dtypes, {name})")
    if name in TORCH_HAS:
        t = torch.from_numpy(codes).view(getattr(torch, name)).to(torch.float64).numpy()
        assert_claim("formats.small_decode", actual=t, expected=ours, context=f"(torch, {name})")


@small
@settings(examples(6))
@given(seed=st.integers(0, 2**32 - 1))
def test_encode_float32_matches_ml_dtypes_and_torch_on_edges(name: str, seed: int) -> None:
    x = drive.edge_inputs(name, seed)
    ours = ref.encode(x, name)
    assert_claim("formats.small_encode", actual=_codes_as_values(ours, name),
                 expected=_codes_as_values(drive.ml_encode_stated(x, name), name),
                 context=f"(ml_dtypes, {name})")
    if name in ("float8_e4m3fnuz", "float8_e5m2fnuz"):
        assert_claim("formats.small_encode",
                     actual=_codes_as_values(drive.torch_encode(x, name), name),
                     expected=_codes_as_values(ours, name), context=f"(torch, {name})")
    if name == "float8_e8m0fnu" and name in TORCH_HAS:
        positive = x[x > 0]  # where formats.e8m0_torch declares no difference but below 2^-127
        positive = positive[(positive <= 2.0**-127) | (positive >= 1.5 * 2.0**-127)]
        assert_claim("formats.small_encode", actual=drive.torch_encode(positive, name),
                     expected=ref.encode(positive, name), context="(torch, float8_e8m0fnu, x > 0)")


@small
def test_float64_input_is_rounded_once_like_ml_dtypes(name: str) -> None:
    """ml_dtypes 0.7 rounds float64 once (NOTE [ Double rounding in the libraries ])."""
    rng = np.random.default_rng(5)
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        x = drive.edge_inputs(name).astype(np.float64)
    finite = x[np.isfinite(x) & (x != 0)]
    with np.errstate(over="ignore"):
        moved = finite + np.spacing(finite) * rng.integers(-3, 4, finite.size) * \
            2.0 ** rng.integers(0, 30, finite.size)
    x = np.concatenate([x, moved])
    assert_claim("formats.small_encode", actual=_codes_as_values(ref.encode(x, name), name),
                 expected=_codes_as_values(drive.ml_encode_stated(x, name), name),
                 context=f"(float64, {name})")


@pytest.mark.parametrize("name", ["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"])
def test_nan_becomes_a_zero_of_the_inverted_sign_as_ml_dtypes_casts_it(name: str) -> None:
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF],
                    dtype=np.uint32).view(np.float32)
    ours = ref.encode(nans, name)
    assert_claim("formats.small_nan", actual=ours, expected=drive.ml_encode(nans, name))
    sign = np.uint8(1 << (ref.FORMATS[name].bits - 1))
    # the guard: the codes are zeros, and their signs are the inputs' inverted
    assert_claim("formats.small_nan", actual=ours,
                 expected=np.where(np.signbit(nans), 0, sign).astype(np.uint8))


@HAS_E8M0
def test_torch_e8m0_cast_differs_from_ml_dtypes_where_declared() -> None:
    fmt = ref.FORMATS["float8_e8m0fnu"]
    x = np.concatenate([drive.edge_inputs("float8_e8m0fnu"), np.array(
        [-4.0, 0.0, -0.0, 1.2 * 2.0**-127, 1.4 * 2.0**-127, 1.5 * 2.0**-127, 2.0**-127],
        dtype=np.float32)])
    torch_codes = drive.torch_encode(x, "float8_e8m0fnu")
    assert_claim("formats.e8m0_torch", actual=_codes_as_values(torch_codes, fmt.name),
                 expected=_codes_as_values(torch_e8m0_codes(x, fmt), fmt.name))
    # the guard: the named points are where torch and ml_dtypes really differ
    named = x[-7:]
    ml = _codes_as_values(drive.ml_encode_stated(named, fmt.name), fmt.name)
    tv = _codes_as_values(torch_codes[-7:], fmt.name)
    assert np.isnan(ml[0]) and tv[:3].tolist() == [4.0, 2.0**-127, 2.0**-127]
    assert ml[3:5].tolist() == [2.0**-127] * 2 and tv[3:5].tolist() == [2.0**-126] * 2


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@small
@settings(examples(1))  # x 600 inputs, every edge class among them; the fuzz profile: more
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_toward_zero_and_stochastic_match_the_exact_oracle(name: str, dtype: type,
                                                           seed: int) -> None:
    rng = np.random.default_rng(seed)
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        x = rng.choice(drive.edge_inputs(name, seed, n_random=256), 600).astype(dtype)
    if dtype == np.float64:
        with np.errstate(invalid="ignore", over="ignore"):
            x = x + np.where(np.isfinite(x), np.spacing(x) * rng.integers(-9, 10, x.size), 0)
    # random words, and the words either side of each input's threshold (where < and <=
    # differ)
    at = np.array([drive.oracle_threshold(v, name) for v in x.tolist()], dtype=np.int64)
    cases = [("toward_zero", np.zeros(x.size, np.uint32)),
             ("stochastic", ref.draw_random_words(x.shape, rng)),
             ("stochastic", np.minimum(at, 2**32 - 1).astype(np.uint32)),
             ("stochastic", np.maximum(at - 1, 0).astype(np.uint32))]
    for rounding, words in cases:
        kw = {"random_bits": words} if rounding == "stochastic" else {}
        got = ref.quantize(x, name, rounding=rounding, overflow="saturate", **kw)
        want = np.array([drive.oracle_round(v, name, rounding, int(w))
                         for v, w in zip(x.tolist(), words.tolist(), strict=True)])
        assert_claim("formats.small_rounding", actual=got.astype(np.float64), expected=want,
                     context=f"({rounding}, {dtype.__name__}, {name})")


@small
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sweeps_classes_from_bits_are_the_classes_of_the_values(name: str,
                                                                     dtype: type) -> None:
    """sweep_small.small_classes counts intervals of the inputs' bits; stated on the values
    instead (float64, exact for every input), the classes are the same, on edge inputs that
    reach every class and both sides of each edge."""
    fmt = ref.FORMATS[name]
    with np.errstate(invalid="ignore"):  # signalling NaNs quiet on widening
        x = drive.edge_inputs(name, 11, n_random=512).astype(dtype)
        a = np.abs(x.astype(np.float64))
    nan, inf, zero = np.isnan(a), np.isinf(a), a == 0
    with np.errstate(invalid="ignore"):
        beyond = (a >= overflow_bound(fmt)) & ~inf
        below = (a < fmt.tiny) & ~zero
    want = {"subnormal": int(below.sum()), "zero": int(zero.sum()),
            "overflow": int(beyond.sum()), "inf": int(inf.sum()), "nan": int(nan.sum())}
    want["normal"] = x.size - sum(want.values())
    assert min(want.values()) > 0 or fmt.convention == "unsigned", want  # every class reached
    assert small_classes(x, nan, fmt) == want


@small
def test_a_chunks_classes_from_its_range_are_the_classes_from_its_bits(name: str) -> None:
    """sweep_small.range_classes, the classes of consecutive patterns counted from the range
    alone (the exhaustive sweep's chunks), equals small_classes on the patterns themselves,
    for ranges that start, end or straddle every class edge, zero, the sign bit and 2^32,
    on either sign, one pattern long to a chunk long."""
    fmt = ref.FORMATS[name]
    edges = [0, *class_edges(fmt, np.float32)]
    centres = [c + sign for c in edges for sign in (0, 2**31)] + [2**32]
    rng = np.random.default_rng(5)
    for centre in centres + [int(c) for c in rng.integers(0, 2**32, 8)]:
        for n in (1, 3, 1 << 16):
            for start in (centre - n // 2, centre - n, centre - 1, centre):
                start = min(max(start, 0), 2**32 - n)
                bits = np.arange(start, start + n, dtype=np.uint64).astype(np.uint32)
                x = bits.view(np.float32)
                want = small_classes(x, np.isnan(x), fmt)
                assert range_classes(start, n, fmt) == want, (name, start, n)
    with pytest.raises(ValueError, match="not within"):
        range_classes(2**32 - 1, 2, fmt)


@small
def test_sampled_sweep_has_no_mismatch(name: str) -> None:
    summary = sweep_sample(name, 1 << 16, seed=3)
    assert summary.total == 1 << 16
    assert summary.by_class["nan"] > 0 and summary.by_class["overflow"] > 0, summary.by_class
    observed = summary.mismatches_torch + summary.mismatches_ml_dtypes
    assert_observed("formats.small_sweep", observed, summary.total, str(summary))


@pytest.mark.slow
@small
def test_exhaustive_sweep_has_no_mismatch(name: str) -> None:
    summary = sweep_range(name, 0, 2**32, workers=2)
    assert summary.total == 2**32
    observed = summary.mismatches_torch + summary.mismatches_ml_dtypes
    assert_observed("formats.small_sweep", observed, summary.total, str(summary))


def test_bad_policies_are_refused_in_one_line() -> None:
    x = np.array([1.0], dtype=np.float32)
    with pytest.raises(ValueError, match="no NaN and no infinity"):
        ref.encode(x, "float4_e2m1fn", overflow="nan")
    with pytest.raises(ValueError, match="no infinity"):
        ref.encode(x, "float8_e4m3fnuz", overflow="inf")
    assert math.isnan(ref.quantize(np.array([-1.0]), "float8_e8m0fnu")[0])


def test_e8m0_differs_from_ml_dtypes_at_zero_only_and_zero_is_the_smallest_value() -> None:
    """NOTE [ E8M0 at zero ]: +-0 gives 2^-127 as every x below it does (1e-300, 2^-149),
    where ml_dtypes gives NaN; on the edge inputs nothing else differs."""
    name = "float8_e8m0fnu"
    x = np.concatenate([drive.edge_inputs(name), np.array([0.0, -0.0, 2.0**-149, 1e-40],
                                                          dtype=np.float32)])
    ours, theirs = ref.encode(x, name), drive.ml_encode(x, name)
    differ = ours != theirs
    assert_claim("formats.e8m0_ml_dtypes", actual=np.array([np.count_nonzero(differ & (x != 0))]),
                 expected=np.array([0]))
    assert differ[x == 0].all() and (ours[x == 0] == 0).all(), "guard: the stated difference"
    tiny = np.array([0.0, -0.0, 1e-300, 2.0**-140], np.float64)
    assert ref.encode(tiny, name).tolist() == [0, 0, 0, 0]
