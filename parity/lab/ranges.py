"""The format range table, rendered from the code.

`range_table()` prints every format's range properties as the reference derives them from
the bits, as torch.finfo gives them, and as ml_dtypes.finfo gives them, flagging any
difference (`python -m parity ranges`; docs/formats.md holds it, parity/lab/gendocs/formats.py).
"""

from __future__ import annotations

import math

import reference.formats as ref
import torch_impl.formats as tim
from parity.oracles import ML_DTYPES, RANGE_FIELDS, ml_dtypes_ranges

FIELDS = tuple(f for f in RANGE_FIELDS if f != "unit_roundoff")  # (eps / 2: one column less)


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
        t = tim.FORMATS.get(name)
        if t is not None and t.small:  # the twin's ranges are the bit layout's: nothing to see
            t = None
        ml = ml_dtypes_ranges(name) if name in ML_DTYPES else None
        torch_diff = [] if t is None else [
            f for f in FIELDS if float(getattr(t, f)) != float(getattr(r, f))]
        ml_diff = [] if ml is None else [f for f in FIELDS if ml[f] != float(getattr(r, f))]
        differences += len(torch_diff) + len(ml_diff)
        torch_cell = "equal" if not torch_diff else "**differs: " + ", ".join(torch_diff) + "**"
        if t is None:
            torch_cell = "from bits" if name in tim.FORMATS else "-"
        ml_cell = "-" if ml is None else (
            "equal" if not ml_diff else "**differs: " + ", ".join(ml_diff) + "**")
        cells = [name, *(_fmt(getattr(r, f)) for f in FIELDS), torch_cell, ml_cell]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("torch.finfo has no smallest_subnormal (torch_impl computes tiny * eps) and no "
                 "exponent limits (read off max and tiny); tf32 has no torch dtype and no "
                 "ml_dtypes type (its torch column is derived from float32's finfo). The small "
                 "formats from float8_e4m3fnuz on take their torch twin's ranges from the bit "
                 "layout (torch_impl/format_spec.py: torch.finfo lacks six and is wrong for "
                 "two); torch 2.13's finfo of the three it has is checked in "
                 "parity/test_formats_small.py (its float8_e5m2fnuz eps is 0.125, not 0.25: "
                 "claim formats.torch_finfo_e5m2fnuz).")
    return "\n".join(lines), differences
