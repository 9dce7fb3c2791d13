"""docs/compile.md, the transformer's part: per-entry ratios of the compiled transformer's
differences to the probe bound, float32 and bfloat16 autocast, and its recompiles, from the
"gpt" record of each torch version in docs/data/compile.json (benchmarks/compile.py)."""

from __future__ import annotations

from parity.drivers.compile_gpt import GPT_SHAPES
from parity.gendocs import section
from parity.gendocs.compile import _measured, _missing, _versions


def _records() -> dict[str, dict]:
    return {v: r["gpt"] for v, r in _measured().items() if "gpt" in r}


def _group(entry: str) -> str:
    """Parameters of the same kind across blocks share a row: h.0 ... h.3 -> h.*."""
    parts = entry.split(".")
    return ".".join("*" if p.isdigit() else p for p in parts)


@section("compile.md", "gpt-numerics")
def _() -> str:
    records = _records()
    if not records:
        return _missing()
    lines = ["Worst |compiled - other| / (eps S) per compared array, S the probe bound (1 = at "
             "the bound), the blocks' parameters of one kind grouped (`h.*`: the worst over the "
             "4 blocks); `differ`: elements not bit-identical to eager.", "",
             "| torch | precision | entry | differ | vs eager | vs reference |",
             "|---|---|---|---:|---:|---:|"]
    for v, rec in sorted(records.items(), key=lambda kv: _versions({kv[0]: 0})):
        for precision in ("fp32", "bf16"):
            grouped: dict[str, list] = {}
            for r in rec[precision]["rows"]:
                g = grouped.setdefault(_group(r["entry"]), [0, 0, 0.0, None])
                g[0] += r["differ"]
                g[1] += r["size"]
                g[2] = max(g[2], r["eager"])
                if r["reference"] is not None:
                    g[3] = max(g[3] or 0.0, r["reference"])
            for entry, (differ, size, eager, ref) in grouped.items():
                lines.append(f"| {v} | {precision} | `{entry}` | {differ} / {size} | "
                             f"{eager:.2g} | {'-' if ref is None else f'{ref:.2g}'} |")
    lines += ["", "Case: " + next(iter(records.values()))["case"] + ". Compile, probes and "
              "comparison, wall clock, one run each (cold cache): "
              + "; ".join(f"torch {v}: float32 {r['fp32']['seconds']:g} s, bfloat16 "
                          f"{r['bf16']['seconds']:g} s ({r['machine']})"
                          for v, r in records.items()) + "."]
    return "\n".join(lines)


@section("compile.md", "gpt-recompiles")
def _() -> str:
    records = _records()
    if not records:
        return _missing()
    versions = sorted(records, key=lambda v: tuple(int(p) for p in v.split(".")))
    shapes = ", ".join(f"({b}, {t})" for b, t in GPT_SHAPES)
    lines = [f"Calls with (batch, sequence) = {shapes}, then (4, 5) followed by a full block "
             "(4, 16); graphs compiled (`counters['stats']['unique_graphs']`):", "",
             "| mode | " + " | ".join(f"torch {v}" for v in versions) + " |",
             "|---|" + "---:|" * len(versions)]
    for m in records[versions[-1]]["recompiles"]:
        lines.append(f"| `{m}` | " + " | ".join(
            str(records[v]["recompiles"][m]["graphs"]) for v in versions) + " |")
    lines.append("| `dynamic`, (4, 5) then (4, 16) | " + " | ".join(
        str(records[v]["full_block"]["graphs"]) for v in versions) + " |")
    lines.append("| `mark_dynamic`, (4, 5) then (4, 16) | " + " | ".join(
        f"`{records[v]['full_block']['mark_dynamic']}`" if isinstance(
            records[v]["full_block"]["mark_dynamic"], str) else "?" for v in versions) + " |")
    last = records[versions[-1]]
    lines += ["", f"The failed guards (torch {versions[-1]}):", ""]
    for m, r in last["recompiles"].items():
        lines.append(f"- `{m}`: " + ("none" if not r["failed_guards"] else
                                     "; ".join(f"`{g}`" for g in r["failed_guards"])))
    full = "; ".join(f"`{g}`" for g in last["full_block"]["failed_guards"])
    lines.append(f"- `dynamic`, a full block after (4, 5): {full}")
    return "\n".join(lines)
