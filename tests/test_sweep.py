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
