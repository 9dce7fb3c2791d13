"""docs/data.md: the claim table."""

from __future__ import annotations

from parity.lab.gendocs import section
from parity.lab.gendocs.recompute import claims_table


@section("data.md", "claims")
def _() -> str:
    return claims_table("data")
