"""The numerics detector's format view is the same in both trees: thresholds derived from a
format's bits count the values torch's cast sends to inf or to zero (numerics.format_view).
Drivers: parity/drivers/numerics.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from common.format_spec import get_format
from parity.compare import assert_claim
from parity.drivers.numerics import count_rows
from parity.drivers.train import one_thread
from parity.strategies import float32_arrays
from reference.numerics import COLUMNS, thresholds


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.mark.parametrize("arithmetic", [False, True], ids=["bucketize", "arithmetic"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
@settings(max_examples=60)
@given(data=st.data())
def test_format_view_counts_match_torch_casts_bitwise(fmt: str, arithmetic: bool,
                                                      data: st.DataObject, device: str) -> None:
    """Thresholds derived from the format's bits count exactly the values torch's cast sends
    to inf or zero, around both edges and everywhere else, whichever way torch numbers the
    values (bucketize, or integer arithmetic on the bits)."""
    x = data.draw(float32_arrays(fmt))
    ref, got = count_rows(x, fmt, device, arithmetic)
    for name, v in zip(COLUMNS, ref, strict=True):
        if v:
            event(f"{fmt}: {name} reached")
    assert_claim("numerics.format_view", got, ref, context=f"{fmt} {x!r}")


@pytest.mark.parametrize("arithmetic", [False, True], ids=["bucketize", "arithmetic"])
@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_format_view_thresholds_are_the_casts_ties(fmt: str, arithmetic: bool,
                                                   device: str) -> None:
    """At the two ties themselves (the edge the strategy aims at, here for certain) and one
    float32 ulp inside them, both trees agree, and the ties are counted, the insides not;
    the specials (+-inf, NaNs of both signs, +-0, the largest finite) too."""
    overflow, underflow = thresholds(get_format(fmt))
    inside = [np.nextafter(np.float32(overflow), np.float32(0)),
              np.nextafter(np.float32(underflow), np.float32(1))]
    specials = [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, np.finfo(np.float32).max]
    x = np.array([overflow, -overflow, underflow, -underflow, *inside, *specials], np.float32)
    ref, got = count_rows(x, fmt, device, arithmetic)
    assert_claim("numerics.format_view", got, ref, context=fmt)
    assert ref[COLUMNS.index("over_max")] == 3 and ref[COLUMNS.index("to_zero")] == 2
