"""Tables rendered from the code: the format range table and the claim table.

`range_table()` prints every format's range properties as the reference derives them from
the bits, as torch.finfo gives them, and as ml_dtypes.finfo gives them, flagging any
difference. `tolerances_markdown()` renders parity/tolerances.py as docs/tolerances.md.
`python -m parity docs` rewrites both; tests/test_docs.py fails when either is stale.
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes

import reference.formats as ref
import torch_impl.formats as tim
from parity.sweep import ML_DTYPES
from parity.tolerances import CLAIMS

FIELDS = ("bits", "exponent_bits", "mantissa_bits", "eps", "max", "tiny",
          "smallest_subnormal", "min_exponent", "max_exponent")
ML_FIELDS = {"bits": "bits", "exponent_bits": "nexp", "mantissa_bits": "nmant", "eps": "eps",
             "max": "max", "tiny": "smallest_normal",
             "smallest_subnormal": "smallest_subnormal", "min_exponent": "minexp",
             "max_exponent": "maxexp"}


def _fmt(v: float) -> str:
    """Integers as integers, powers of two as 2^k, anything else exactly in hex float."""
    v = float(v)
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    m, e = math.frexp(v)
    return f"2^{e - 1}" if m == 0.5 else f"{v:.6g} ({v.hex()})"


def range_table() -> tuple[str, int]:
    """(Markdown table, number of differences): one row per format, one column per property;
    the last column says whether torch.finfo and ml_dtypes.finfo agree on every property."""
    lines = ["| format | " + " | ".join(FIELDS) + " | torch.finfo | ml_dtypes.finfo |",
             "|---" * (len(FIELDS) + 3) + "|"]
    differences = 0
    for name, r in ref.FORMATS.items():
        t = tim.FORMATS[name]
        fi = ml_dtypes.finfo(ML_DTYPES[name]) if name in ML_DTYPES else None
        torch_diff = [f for f in FIELDS if float(getattr(t, f)) != float(getattr(r, f))]
        ml_diff = [] if fi is None else [
            f for f in FIELDS if float(getattr(fi, ML_FIELDS[f])) != float(getattr(r, f))]
        differences += len(torch_diff) + len(ml_diff)
        torch_cell = "equal" if not torch_diff else "**differs: " + ", ".join(torch_diff) + "**"
        ml_cell = "-" if fi is None else (
            "equal" if not ml_diff else "**differs: " + ", ".join(ml_diff) + "**")
        cells = [name, *(_fmt(getattr(r, f)) for f in FIELDS), torch_cell, ml_cell]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("torch.finfo has no smallest_subnormal (torch_impl computes tiny * eps) and no "
                 "exponent limits (read off max and tiny); tf32 has no torch dtype and no "
                 "ml_dtypes type (its torch column is derived from float32's finfo).")
    return "\n".join(lines), differences


def tolerances_markdown() -> str:
    """docs/tolerances.md: every claim, its kind, tolerance and reason."""
    out = ["# Claims and tolerances", "",
           "Generated from `parity/tolerances.py` by `python -m parity docs`; "
           "a test fails when this page is out of date. "
           "`python -m parity report` checks every claim and prints the observed worst case.",
           ""]
    topic = None
    for c in CLAIMS:
        if c.topic != topic:
            topic = c.topic
            out += [f"## {topic}", "", "| claim | kind | tolerance | statement | reason |",
                    "|---|---|---|---|---|"]
        cells = [f"`{c.id}`", c.kind, c.tolerance, c.statement, c.reason]
        out.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells)
                   + " |")
        nxt = CLAIMS.index(c) + 1
        if nxt == len(CLAIMS) or CLAIMS[nxt].topic != topic:
            out.append("")
    return "\n".join(out)


DOCS = Path(__file__).resolve().parent.parent / "docs"
START, END = "<!-- range-table:start -->", "<!-- range-table:end -->"


def formats_page_with_table(page: str) -> str:
    """docs/formats.md's text with the generated range table between its markers."""
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{range_table()[0]}\n{END}{tail}"


def update_docs() -> list[Path]:
    """Regenerate the generated parts of docs/: the range table and docs/tolerances.md."""
    formats_md = DOCS / "formats.md"
    formats_md.write_text(formats_page_with_table(formats_md.read_text(encoding="utf-8")),
                          encoding="utf-8")
    tolerances_md = DOCS / "tolerances.md"
    tolerances_md.write_text(tolerances_markdown(), encoding="utf-8")
    return [formats_md, tolerances_md]
