"""docs/formats.md: the small formats' table built from the bits (with what the first
overflowing value and +inf become in the reference, the torch twin and ml_dtypes, run
now), and their encode benchmark (from the committed docs/data/formats_small_encode.json)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch

import reference.formats as ref
import torch_impl.formats as tim
from parity.drivers.formats_small import ml_encode, ml_values
from parity.lab.gendocs import section
from parity.lab.ranges import _fmt
from parity.oracles import SMALL_FORMATS, TORCH_CASTS
from parity.sweep_small import overflow_bound
from torch_impl import small_formats as small

BENCH_JSON = Path(__file__).resolve().parents[3] / "docs" / "data" / "formats_small_encode.json"


def _code_ranges(codes: np.ndarray) -> str:
    """0x79-0x7F, 0xF9-0xFF: runs of consecutive codes, or - for none."""
    if codes.size == 0:
        return "-"
    runs, start = [], codes[0]
    for a, b in itertools.pairwise(codes):
        if b != a + 1:
            runs.append((start, a))
            start = b
    runs.append((start, codes[-1]))
    return ", ".join(f"0x{a:02X}" if a == b else f"0x{a:02X}-0x{b:02X}" for a, b in runs)


def _value_name(v: float, fmt: ref.FloatFormat) -> str:
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+inf" if v > 0 else "-inf"
    return "max" if v == fmt.max else _fmt(v)


def _overflow_cells(name: str) -> list[str]:
    """What the first value beyond the format (the rounding's tie above max; E8M0: 1.5 max)
    and +inf become, in the reference, the torch twin and ml_dtypes, each by default."""
    fmt = ref.FORMATS[name]
    x = np.array([overflow_bound(fmt), np.inf], dtype=np.float32)
    values = ml_values(name)
    cells = []
    for codes in (ref.encode(x, name), tim.encode(torch.from_numpy(x), name).numpy(),
                  ml_encode(x, name)):
        cells.append(" / ".join(_value_name(values[c], fmt) for c in codes.astype(np.int64)))
    return cells


@section("formats.md", "small-formats-table")
def _() -> str:
    head = ("| format | bits | e, m | bias | max | tiny | smallest subnormal | eps | NaN codes "
            "| inf codes | overflow, inf: reference | torch twin | ml_dtypes |")
    lines = [head, "|---" * 13 + "|"]
    for name in SMALL_FORMATS:
        fmt = ref.FORMATS[name]
        codes = np.arange(2**fmt.bits)
        values = ref.decode(codes.astype(np.uint8), name)
        cells = [f"`{name}`", str(fmt.bits), f"{fmt.exponent_bits}, {fmt.mantissa_bits}",
                 str(fmt.bias), *(_fmt(getattr(fmt, f)) for f in
                                  ("max", "tiny", "smallest_subnormal", "eps")),
                 _code_ranges(codes[np.isnan(values)]), _code_ranges(codes[np.isinf(values)]),
                 *_overflow_cells(name)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Every column but the last three is derived from the bit layout "
              "(common/format_spec.py). The last three run each library now, by default, on "
              "the first float32 value beyond the format (the tie above max, which rounds "
              "up; E8M0: 1.5 max, its ties rounding up) and on +inf. The torch twin is "
              f"torch's own cast for {', '.join(TORCH_CASTS)}; torch has no cast to the "
              "others, and rounds to nearest by its cast to a sibling format (the same "
              "mantissa width, x scaled by a power of two) for "
              f"{', '.join(small.SIBLING)} (torch_impl/small_formats.py)."]
    return "\n".join(lines)


@section("formats.md", "small-formats-benchmark")
def _() -> str:
    if not BENCH_JSON.exists():
        return "(no measurement: run python benchmarks/formats_small.py)"
    bench = json.loads(BENCH_JSON.read_text(encoding="utf-8"))
    target = bench["twin_target_s"]
    lines = [f"Measured by `python benchmarks/formats_small.py`: {bench['what']}; clock: "
             f"{bench['clock']}; threads: {bench['threads']}; {bench['repeats']} repeats, "
             f"median [interquartile range]; {bench['machine']}; {bench['versions']}.", "",
             "| format | twin ns/input | reference ns/input | ml_dtypes ns/input | twin / "
             "reference | twin / ml_dtypes | twin's share of a sweep, 2 cores | the reference "
             f"and ml_dtypes alone, 2 cores (a sweep's floor; target {target:g} s) |",
             "|---" * 8 + "|"]

    def q(d: dict) -> str:
        return f"{d['median']:.2f} [{d['q1']:.2f}, {d['q3']:.2f}]"

    for r in bench["rows"]:
        floor = (r["reference_ns"]["median"] + r["ml_dtypes_ns"]["median"]) * 2**32 / 2 / 1e9
        lines.append(f"| `{r['format']}` | {q(r['twin_ns'])} | {q(r['reference_ns'])} | "
                     f"{q(r['ml_dtypes_ns'])} | {q(r['twin_over_reference'])} | "
                     f"{q(r['twin_over_ml_dtypes'])} | {r['twin_sweep_s_2_cores']:.1f} s | "
                     f"{floor:.1f} s |")
    lines += ["", "The last column is the part of an exhaustive sweep no torch column can "
              "remove: the reference's encode and ml_dtypes' cast of all 2^32 inputs, on two "
              "cores at the table's speeds, before the twin, the comparisons and the "
              "command's start (its import of torch); the sweeps' own times are in the table "
              "of exhaustive sweeps below."]
    return "\n".join(lines)
