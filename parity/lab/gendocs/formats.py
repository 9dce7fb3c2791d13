"""docs/formats.md: the range table of every format (reference / torch.finfo / ml_dtypes), the
encode benchmark's ratios and the exhaustive sweeps' times (from the committed
docs/data/formats_encode.json and formats_sweep.json)."""

from __future__ import annotations

import json

from parity.drivers.formats import ENCODE_TARGETS, encode_benchmark
from parity.lab.gendocs import section
from parity.lab.ranges import range_table
from parity.oracles import STORAGE_FORMATS, SWEEP_FORMATS
from parity.sweep import SWEEP_JSON


@section("formats.md", "range-table")
def _() -> str:
    return range_table()[0]


@section("formats.md", "encode-benchmark")
def _() -> str:
    bench = encode_benchmark()
    rows = {(r["format"], r["log2_size"]): r for r in bench["rows"]}
    sizes = sorted({k for _, k in rows})
    lines = [f"Measured by `python benchmarks/formats.py`: {bench['what']}; clock: "
             f"{bench['clock']}; threads: {bench['threads']}; {bench['repeats']} repeats "
             f"({bench['spread']}); "
             f"{bench['machine']}; {bench['versions']}.", "",
             "torch time / reference time, median [interquartile range]:", "",
             "| elements | " + " | ".join(STORAGE_FORMATS) + " |",
             "|---" * (len(STORAGE_FORMATS) + 1) + "|"]
    for k in sizes:
        cells = [f"{q['median']:.3f} [{q['q1']:.3f}, {q['q3']:.3f}]"
                 for q in (rows[(name, k)]["ratio"] for name in STORAGE_FORMATS)]
        lines.append(f"| 2^{k} | " + " | ".join(cells) + " |")
    lines.append("")
    for name in STORAGE_FORMATS:
        ratios = {k: rows[(name, k)]["ratio"]["median"] for k in sizes}
        per_element = [rows[(name, k)]["reference_ns"]["median"] for k in sizes if k >= 14]
        least = min(ratios, key=lambda k: ratios[k])
        flat = max(per_element) / min(per_element)
        target = ENCODE_TARGETS[name]
        lines.append(
            f"- {name}: at least {ratios[least]:.3f}x torch's speed (at 2^{least}; target "
            f"{target}x: {'met' if ratios[least] >= target else 'not met'}); from 2^14 up the "
            f"slowest size is {flat:.2f}x the best per element (target 1.5x: "
            f"{'met' if flat <= 1.5 else 'not met'}).")
    lines += ["", _float16_ceiling(rows, sizes)]
    return "\n".join(lines)


# The nearest-even path's elementwise passes over a block of float32 words, counted in
# reference/encode_kernels.py for float16 (and float8): magnitude 3 (sign, |word|, NaN
# mask), round_nearest_even 9 (the float addition and its bits for the subnormal range,
# max with the smallest normal, the odd bit 2, the carry 3, min), pack 3 (overflow, sign
# shift, sign or) and the store into the codes: 16, besides a test for any NaN.
FLOAT16_PASSES = 16


def _float16_ceiling(rows: dict, sizes: list[int]) -> str:
    """What 0.1x of torch's float16 cast would need, from the benchmark at float16's worst
    ratio: the reference's ns per pass and torch's ns per element."""
    worst = min(sizes, key=lambda k: rows[("float16", k)]["ratio"]["median"])
    row = rows[("float16", worst)]
    ours, theirs = row["reference_ns"]["median"], row["torch_ns"]["median"]
    per_pass = ours / FLOAT16_PASSES
    return (f"float16's ceiling, at 2^{worst}: {FLOAT16_PASSES} NumPy passes per block at "
            f"{ours:.2f} ns per element, {per_pass:.3f} ns per pass, against torch's "
            f"{theirs:.3f} ns per element. 0.1x needs {10 * theirs:.2f} ns per element: "
            f"{10 * theirs / per_pass:.1f} passes at that cost, fewer than the magnitude and the "
            "rounding take alone (12). Only a fused kernel, one pass doing every step "
            "per element, would reach it, and custom kernels are out of the project's scope "
            "(DESIGN.md).")


@section("formats.md", "sweep-times")
def _() -> str:
    runs = json.loads(SWEEP_JSON.read_text(encoding="utf-8")) if SWEEP_JSON.exists() else {}
    lines = ["Recorded by `python -m parity sweep FORMAT --exhaustive --record` (CPU times are "
             "thread CPU time summed over the workers; the cast alone ran on every chunk just "
             "before the sweep of it):", "",
             "| format (third library's cast) | inputs | mismatches (torch, ml_dtypes) "
             "| wall s (both) | workers "
             "| CPU s: sweep | CPU s: cast alone | sweep / cast | load at end |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in SWEEP_FORMATS:
        r = runs.get(name)
        if r is None:
            lines.append(f"| {name} | not recorded |" + " |" * 7)
            continue
        ratio = r["cpu_seconds_sweep"] / r["cpu_seconds_cast_alone"] \
            if r["cpu_seconds_cast_alone"] else float("nan")
        lines.append(
            f"| {name} ({r['cast']}) | {r['inputs']:,} | {r['mismatches_torch']}, "
            f"{r['mismatches_ml_dtypes']} | {r['wall_seconds']} | {r['workers']} | "
            f"{r['cpu_seconds_sweep']} | {r['cpu_seconds_cast_alone']} | {ratio:.2f} | "
            f"{r['load_average_1min_at_end']} |")
    machines = sorted({f"{r['machine']}; {r['versions']}" for r in runs.values()})
    if machines:
        lines += ["", "On " + " / ".join(machines) + "."]
    return "\n".join(lines)
