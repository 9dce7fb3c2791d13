"""Tables rendered from the code: the format range table and the claim table.

`range_table()` prints every format's range properties as the reference derives them from
the bits, as torch.finfo gives them, and as ml_dtypes.finfo gives them, flagging any
difference. `tolerances_markdown()` renders parity/tolerances.py as docs/tolerances.md.
Both docs pages are checked to be current by tests/test_docs.py.
"""

from __future__ import annotations

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
    v = float(v)
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.6g} (2^{_log2(v)})" if _log2(v) is not None else f"{v:.6g}"


def _log2(v: float) -> int | None:
    import math

    m, e = math.frexp(v)
    return e - 1 if m == 0.5 else None


def range_table() -> tuple[str, int]:
    """(Markdown table, number of differences) over every named format."""
    lines = ["| format | property | reference (from bits) | torch.finfo | ml_dtypes.finfo |",
             "|---|---|---|---|---|"]
    differences = 0
    for name, r in ref.FORMATS.items():
        t = tim.FORMATS[name]
        fi = ml_dtypes.finfo(ML_DTYPES[name]) if name in ML_DTYPES else None
        for f in FIELDS:
            rv, tv = getattr(r, f), getattr(t, f)
            mv = getattr(fi, ML_FIELDS[f]) if fi is not None else None
            same = float(rv) == float(tv) and (mv is None or float(mv) == float(rv))
            differences += not same
            flag = "" if same else " **DIFFERS**"
            lines.append(f"| {name} | {f} | {_fmt(rv)} | {_fmt(tv)} | "
                         f"{'-' if mv is None else _fmt(mv)}{flag} |")
    lines.append("")
    lines.append("torch.finfo has no smallest_subnormal (torch_impl computes tiny * eps) and no "
                 "exponent limits (read off max and tiny); tf32 has no torch dtype and no "
                 "ml_dtypes type (its torch column is derived from float32's finfo).")
    return "\n".join(lines), differences


def tolerances_markdown() -> str:
    """docs/tolerances.md: every claim, its kind, tolerance and reason."""
    out = ["# Claims and tolerances", "",
           "Generated from `parity/tolerances.py` by `python -m parity tolerances --write "
           "docs/tolerances.md`; a test fails when this page is out of date. "
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
