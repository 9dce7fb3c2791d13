"""docs/formats.md: the range table of every format (reference / torch.finfo / ml_dtypes), and
the encode benchmark's ratios (from the committed docs/data/formats_encode.json)."""

from __future__ import annotations

from parity.drivers.formats import ENCODE_TARGETS, encode_benchmark
from parity.gendocs import section
from parity.oracles import STORAGE_FORMATS
from parity.ranges import range_table


@section("formats.md", "range-table")
def _() -> str:
    return range_table()[0]


@section("formats.md", "encode-benchmark")
def _() -> str:
    bench = encode_benchmark()
    rows = {(r["format"], r["log2_size"]): r for r in bench["rows"]}
    sizes = sorted({k for _, k in rows})
    lines = [f"Measured by `python benchmarks/formats.py`: {bench['what']}; {bench['clock']}, "
             f"{bench['threads']}, {bench['repeats']} repeats ({bench['spread']}); "
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
    return "\n".join(lines)
