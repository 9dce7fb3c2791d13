"""docs/formats.md: the range table of every format, reference / torch.finfo / ml_dtypes."""

from __future__ import annotations

from parity.gendocs import section
from parity.ranges import range_table


@section("formats.md", "range-table")
def _() -> str:
    return range_table()[0]
