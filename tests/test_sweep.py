"""The exhaustive sweep's bookkeeping on ranges whose classes are known by hand: its counts
by input class, and the CPU time of the third library's cast, timed inside the sweep."""

from __future__ import annotations

import pytest

from parity import sweep

INF32 = 0x7F800000


@pytest.mark.parametrize("name", ["float8_e5m2", "float8_e4m3fn", "bfloat16"])
def test_a_sweep_counts_inf_and_nan_inputs_and_times_its_cast_within_it(name: str) -> None:
    """+inf and the 2^16 - 1 NaN patterns above it: 1 inf, the rest NaN, nothing else; the
    cast's CPU time is part of the sweep's, and both were measured."""
    s = sweep.sweep_range(name, INF32, INF32 + sweep.CHUNK, workers=1)
    assert s.total == sweep.CHUNK
    assert s.by_class == {"normal": 0, "subnormal": 0, "zero": 0, "overflow": 0, "inf": 1,
                          "nan": sweep.CHUNK - 1}
    assert (s.mismatches_torch, s.mismatches_ml_dtypes) == (0, 0)
    assert 0 < s.oracle_cpu_seconds < s.cpu_seconds


def test_a_sweep_counts_zeros_subnormals_and_normals_by_their_bfloat16_code() -> None:
    """float32 +0, its 2^23 - 1 positive subnormals and the first 2^16 normals, classed by
    the bfloat16 code they round to (bfloat16 has float32's exponent range, 7 bits less)."""
    s = sweep.sweep_range("bfloat16", 0, 0x00800000 + sweep.CHUNK, workers=1)
    # Up to 0x8000 (half the smallest bfloat16 subnormal, a tie to the even 0) the patterns
    # round to zero: 0x8001 with +0 itself. From 0x7F8000 (halfway between the largest
    # subnormal 0x7F and the smallest normal 0x80, a tie to the even 0x80) they round up
    # to the smallest normal: 0x8000 patterns.
    assert s.by_class["zero"] == 0x8001
    assert s.by_class["subnormal"] == 0x00800000 - 0x8001 - 0x8000
    assert s.by_class["normal"] == sweep.CHUNK + 0x8000
    assert s.by_class["overflow"] == s.by_class["inf"] == s.by_class["nan"] == 0


def test_a_sweep_reaches_the_last_bit_pattern_across_a_task_boundary() -> None:
    """The top 2^24 + 3 patterns, two tasks (sweep_range cuts at 2^24 inputs) ending at
    0xFFFFFFFF: -inf (0xFF800000) once, the 2^23 - 1 negative NaNs above it all counted
    (the last chunk included), and every finite pattern below it overflows float8_e5m2."""
    start = 2**32 - (1 << 24) - 3
    s = sweep.sweep_range("float8_e5m2", start, 2**32, workers=1)
    assert s.total == (1 << 24) + 3
    assert s.by_class == {"normal": 0, "subnormal": 0, "zero": 0, "overflow": (1 << 23) + 3,
                          "inf": 1, "nan": (1 << 23) - 1}
    assert (s.mismatches_torch, s.mismatches_ml_dtypes) == (0, 0)


@pytest.mark.parametrize("name", ["float8_e5m2", "float8_e4m3fn"])
def test_a_sweep_counts_a_nan_class_change_and_only_that(name: str, monkeypatch) -> None:
    """A reference whose codes are changed on purpose: on the chunk of patterns from 1.0 up
    every code becomes NaN, a mismatch against both libraries for each input; on the NaN
    inputs every NaN code becomes another NaN code (e5m2: another payload; e4m3fn has one
    NaN magnitude: the other sign), no mismatch, NaN being one class."""
    fmt = sweep.ref.FORMATS[name]
    encode = sweep.ref.encode
    sign = 1 << (fmt.bits - 1)
    other_nan = fmt.nan_code + 1 if fmt.convention == "ieee" else fmt.nan_code | sign

    def changed(x, *args, **kwargs):
        codes = encode(x, *args, **kwargs)
        bits = x.view("uint32")
        codes[(bits >= 0x3F800000) & (bits < 0x40000000)] = fmt.nan_code
        codes[(bits & 0x7FFFFFFF) > INF32] = other_nan
        return codes

    monkeypatch.setattr(sweep.ref, "encode", changed)
    one, nan = 0x3F800000, INF32 + 1
    s = sweep.sweep_range(name, one, one + sweep.CHUNK, workers=1)
    assert (s.mismatches_torch, s.mismatches_ml_dtypes) == (sweep.CHUNK, sweep.CHUNK)
    assert len(s.examples) == 10 and s.examples[0].startswith("input 0x3f800000")
    s = sweep.sweep_range(name, nan, nan + sweep.CHUNK, workers=1)
    assert s.by_class["nan"] == sweep.CHUNK
    assert (s.mismatches_torch, s.mismatches_ml_dtypes) == (0, 0)


def test_e8m0s_torch_column_agrees_on_chunks_of_either_sign_at_zero_and_below_tiny() -> None:
    """torch's declared E8M0 difference is read off the reference's own codes in a chunk
    below 2^31 and from |x|'s encode above it: +-0 (2^-127's code for torch), the float32
    subnormals that torch rounds up to 2^-126, and their negative mirrors all agree (torch
    2.6 has no such cast, and its twin follows the reference)."""
    low = 0x00400000  # 2^-127's float32 pattern, the band torch rounds up starts above it
    for start in (0, low, 2**31, 2**31 + low):
        s = sweep.sweep_range("float8_e8m0fnu", start, start + sweep.CHUNK, workers=1)
        assert (s.mismatches_torch, s.mismatches_ml_dtypes) == (0, 0), (hex(start), s.examples)
