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
    """Where each pair of MX variants parts, by class of block, computed here on the edge
    blocks (parity/drivers/mx.py variant_disagreements; parity/test_mx_variants.py recomputes
    it against this page)."""
    from parity.drivers.mx import CLASSES, variant_disagreements

    table = variant_disagreements()
    lines = ["| variants (scale mode) | " + " | ".join(CLASSES) + " |",
             "|---|" + "---:|" * len(CLASSES)]
    for (pair, mode), row in table.items():
        lines.append(f"| {pair} ({mode}) | "
                     + " | ".join(f"{n} of {total}" for n, total in row.values()) + " |")
    return (
        "Blocks whose decoded values differ (NaN as one value) between two variants, by "
        "class of block, over the element formats both take (the edge blocks of "
        "`parity/strategies/mx.py`, 16 of each kind per format; a block is counted in the "
        "first class that holds, read off the specification's conversion; claim "
        "`mx.variants_table`). Who is right by the text of OCP MX 1.0 (section 6.3), per "
        "class: NaN in the block: the specification (and microxcaling, torchao) make the "
        "block NaN, Transformer Engine drops the NaN from the amax and keeps the other "
        "values (a choice the text does not make: its conversion has no NaN input case); "
        "inf in the block: the specification, NaN (floor(log2 inf) has no finite value; "
        "torchao reads a finite scale off inf's exponent field under floor; rceil is not "
        "OCP's and saturates to 2^127 in every variant); -0 elements: the specification "
        "keeps -0 (the element formats have it), microxcaling's Python path makes an "
        "element -0 into +0 (torch.sign) and its C++ path every zero +0; code 0: the "
        "specification's X = 2^-127 is exact, torchao divides by 2^-126 under floor and "
        "multiplies by 1 under rceil (Transformer Engine before v2.13 did too; at d0067d0 it "
        "multiplies by 2^127, as the text does); float32 log2 near 2^k: the specification's "
        "floor(log2 amax) is exact, microxcaling's Python path rounds log2 up to k a few "
        "ulps below 2^k and takes a scale one binade too high; ties: the specification "
        "leaves the element rounding to the format's conversion (nearest even here), "
        "microxcaling rounds ties away (both are roundings to nearest); any other: a pair "
        "under different scale modes (microxcaling's floor against Transformer Engine's "
        "rceil) differs wherever floor clips.\n\n" + "\n".join(lines))


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
