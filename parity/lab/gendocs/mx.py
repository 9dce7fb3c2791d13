"""docs/mx.md: the counts table (clipped blocks per scale mode, ties-away differences), read
from docs/data/mx_counts.json (benchmarks/mx.py; parity/test_mx.py recounts it, slow)."""

from __future__ import annotations

import json

from parity.lab.gendocs import DOCS, section

COUNTS = DOCS / "data" / "mx_counts.json"
MODES = ("floor", "ceil", "even", "rceil", "rceil_log2f")
FORMATS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
NAMES = {"normal": "normal N(0, 1)", "student_t3": "Student-t, 3 dof",
         "gpt": "compact GPT, Linear inputs"}


def _load() -> dict | None:
    return json.loads(COUNTS.read_text(encoding="utf-8")) if COUNTS.is_file() else None


@section("mx.md", "clipping")
def _() -> str:
    record = _load()
    if record is None:
        return f"No counts committed ({COUNTS.name} is missing: python benchmarks/mx.py)."
    table = record["table"]
    head = "| distribution | element format | " + " | ".join(f"`{m}`" for m in MODES) + " |"
    lines = [head, "|---|---|" + "---:|" * len(MODES)]
    for dist, by_fmt in table["clipped"].items():
        n = table["blocks"][dist]
        for fmt in FORMATS:
            cells = []
            for m in MODES:
                ref, tor = by_fmt[fmt][m]
                assert ref == tor, f"the committed counts differ between the trees: {dist}"
                cells.append(f"{ref} ({100 * ref / n:.1f}%)")
            lines.append(f"| {NAMES[dist]} | `{fmt}` | " + " | ".join(cells) + " |")
    return (f"Blocks (of {record['blocks_per_distribution']:,} blocks of 32 per distribution) "
            "whose scaled amax lies beyond the element format's max, so that the clamp, not "
            "the rounding, sets their largest element; the same count in both trees (claim "
            "`mx.clipping`):\n\n" + "\n".join(lines))


@section("mx.md", "ties-away")
def _() -> str:
    record = _load()
    if record is None:
        return f"No counts committed ({COUNTS.name} is missing: python benchmarks/mx.py)."
    table = record["table"]
    head = "| distribution | input | " + " | ".join(f"`{f}`" for f in FORMATS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(FORMATS)]
    for dist in table["away"]:
        for part, label in (("away", "float32"), ("away_bf16", "rounded to bfloat16")):
            cells = [str(table[part][dist][f][0]) for f in FORMATS]
            lines.append(f"| {NAMES[dist]} | {label} | " + " | ".join(cells) + " |")
    n = record["blocks_per_distribution"] * 32
    return (f"Elements (of {n:,} per distribution, floor scale mode) whose code under "
            "`rounding=\"nearest_away\"` differs from nearest-even's, the same count in both "
            "trees:\n\n" + "\n".join(lines))


@section("mx.md", "variants")
def _() -> str:
    """Where torchao's variant leaves the specification, by class of block, computed here on
    the edge blocks of the tests (parity/strategies/mx.py: 64 of each kind per format)."""
    import numpy as np

    from parity.strategies.mx import edge_array
    from reference import mx as rmx

    classes = ("code 0 (scale 2^-127)", "holds +-inf", "any other")
    head = ("| element format | mode | " + " | ".join(classes)
            + " |\n|---|---|" + "---:|" * len(classes))
    lines, blocks = [head], 0
    for fmt in FORMATS:
        x = edge_array(fmt, seed=0, per_kind=64)
        blocks = len(x)
        for mode in ("floor", "rceil"):
            spec = rmx.to_mx(x, fmt, mode)
            ocp, ao = rmx.from_mx(spec), rmx.from_mx(rmx.to_mx(x, fmt, mode, variant="torchao"))
            differ = (~((ocp == ao) | (np.isnan(ocp) & np.isnan(ao)))).any(axis=-1)
            inf = np.isinf(x).any(axis=-1)
            code0 = (spec.scales[:, 0] == 0) & ~inf
            cells = [f"{int((differ & c).sum())} of {int(c.sum())}"
                     for c in (code0, inf, ~code0 & ~inf)]
            lines.append(f"| `{fmt}` | `{mode}` | " + " | ".join(cells) + " |")
    return (f"Blocks (of {blocks:,} edge blocks of 32 per element format: every kind of "
            "`parity/strategies/mx.py`, 64 each) whose decoded values differ between the "
            "specification (`variant=\"ocp\"`, the default) and torchao 0.18's variant, by "
            "class. Who is right by the text, per class: at code 0 the specification "
            "(P_i = V_i / X with the stored X = 2^-127; torchao divides by 2^-126 under "
            "floor and multiplies by 1 under rceil, so the block decodes at half its value "
            "or at zero); for a block holding +-inf the specification (floor(log2 amax) has "
            "no finite value and E8M0's only non-finite code is NaN: the block is NaN, as "
            "in microxcaling; torchao reads a finite scale off inf's exponent field under "
            "floor, and both saturate d to 2^127 under rceil, cuBLAS's rule); elsewhere they "
            "agree (claims `mx.ocp` and `mx.torchao`):\n\n" + "\n".join(lines))


@section("mx.md", "nvfp4-variants")
def _() -> str:
    """Where torchao's two-level NVFP4 leaves Transformer Engine's recipe (the default), by
    class of tensor, computed here (seeded inputs; torchao's g from the finite values)."""
    import numpy as np

    from reference import mx as rmx

    rng = np.random.default_rng(0)
    cases = {"all-zero tensor": np.zeros((4, 64), np.float32),
             "N(0, 1) tensor": rng.standard_normal((64, 64)).astype(np.float32),
             "Student-t (3 dof) tensor": rng.standard_t(3, (64, 64)).astype(np.float32)}
    far = rng.standard_normal((8, 64)).astype(np.float32)
    far[0, :16] *= np.float32(1e-7)
    cases["a block at 1e-7 of the tensor's amax"] = far
    for name, value in (("one inf element", np.inf), ("one NaN element", np.nan)):
        x = rng.standard_normal((8, 64)).astype(np.float32)
        x[0, 3] = value
        cases[name] = x
    lines = ["| tensor | values that differ | NaN (TE) | NaN (torchao) |", "|---|---:|---:|---:|"]
    for name, x in cases.items():
        te = rmx.from_nvfp4(rmx.to_nvfp4(x))
        g = rmx.per_tensor_scale(np.where(np.isfinite(x), x, np.float32(0)))
        ao = rmx.from_nvfp4(rmx.to_nvfp4(x, g, variant="torchao"))
        differ = ~((te == ao) | (np.isnan(te) & np.isnan(ao)))
        lines.append(f"| {name} | {int(differ.sum()):,} of {x.size:,} | "
                     f"{int(np.isnan(te).sum()):,} | {int(np.isnan(ao).sum()):,} |")
    return ("Decoded values of two-level NVFP4 under Transformer Engine's recipe (the default) "
            "and torchao 0.18's `nvfp4_quantize` (`variant=\"torchao\"`), by class of tensor. "
            "Who follows NVIDIA's training recipe: TE's, by definition (it is the recipe's "
            "reference). The two differ by construction in the scale chain (TE: one rounding "
            "of amax S_enc / 6, no lower clamp, the dequantize (S A) / 2688; torchao: b / g "
            "then 1 / g / S, S clamped to 2^-6, the dequantize S g), so values differ on "
            "ordinary tensors too; at an all-zero tensor torchao's g = 0 makes every value "
            "NaN, and a block far below the tensor's amax keeps TE's subnormal or zero scale "
            "where torchao pins it at 2^-6; an inf or NaN element follows each library's "
            "propagation (TE dequantizes through A):\n\n" + "\n".join(lines))
