"""docs/model.md: the tape of the compact model, tensor by tensor, against torch's hooks."""

from __future__ import annotations

from parity.gendocs import section


@section("model.md", "tape-table")
def _() -> str:
    from parity.checks.nn import tape_table_markdown

    return tape_table_markdown()
