"""docs/compile.md, the transformer's part: per-entry ratios of the compiled transformer's
differences to the probe bound, float32 and bfloat16 autocast, and its recompiles, from the
"gpt" record of each torch version in docs/data/compile.json (benchmarks/compile.py)."""

from __future__ import annotations

from parity.drivers.compile_gpt import GPT_SHAPES
from parity.lab.gendocs import section
from parity.lab.gendocs.compile import _measured, _missing


def _records() -> dict[str, dict]:
    return {v: r["gpt"] for v, r in _measured().items() if "gpt" in r}


def _group(entry: str) -> str:
    """Parameters of the same kind across blocks share a row: h.0 ... h.3 -> h.*."""
    parts = entry.split(".")
    return ".".join("*" if p.isdigit() else p for p in parts)


def _grouped(rows: list[dict]) -> dict[str, list]:
    """entry kind -> [differ, size, worst vs eager, worst vs reference or None]."""
    grouped: dict[str, list] = {}
    for r in rows:
        g = grouped.setdefault(_group(r["entry"]), [0, 0, 0.0, None])
        g[0] += r["differ"]
        g[1] += r["size"]
        g[2] = max(g[2], r["eager"])
        if r["reference"] is not None:
            g[3] = max(g[3] or 0.0, r["reference"])
    return grouped


def _worst_line(v: str, rec: dict) -> str:
    parts = []
    for precision in ("fp32", "bf16"):
        grouped = _grouped(rec[precision]["rows"])
        beyond = [k for k, g in grouped.items() if g[2] > 1]
        within = {k: g for k, g in grouped.items() if k not in beyond}
        eager = max(g[2] for g in within.values())
        refs = [g[3] for g in within.values() if g[3] is not None]
        text = f"{precision} vs eager {eager:.2g}" + (f", vs reference {max(refs):.2g}"
                                                      if refs else "")
        text += "".join(f"; `{k}` {grouped[k][2]:.3g} (beyond)" for k in beyond)
        parts.append(text)
    return f"- torch {v}: " + "; ".join(parts)


@section("compile.md", "gpt-numerics")
def _() -> str:
    records = _records()
    if not records:
        return _missing()
    versions = sorted(records, key=lambda v: tuple(int(p) for p in v.split(".")))
    newest = versions[-1]
    lines = [f"Torch {newest}: worst |compiled - other| / (eps S) per compared array, S the "
             "probe bound (1 = at the bound), the blocks' parameters of one kind grouped "
             "(`h.*`: the worst over the 4 blocks); `differ`: elements not bit-identical to "
             "eager.", "",
             "| precision | entry | differ | vs eager | vs reference |",
             "|---|---|---:|---:|---:|"]
    for precision in ("fp32", "bf16"):
        for entry, (differ, size, eager, ref) in _grouped(
                records[newest][precision]["rows"]).items():
            lines.append(f"| {precision} | `{entry}` | {differ} / {size} | {eager:.2g} | "
                         f"{'-' if ref is None else f'{ref:.2g}'} |")
    lines += ["", "The worst array of every torch measured (docs/data/compile.json has each "
              "row):", ""]
    lines += [_worst_line(v, records[v]) for v in versions]
    lines += ["", "Case: " + records[newest]["case"] + ". Compile, probes and comparison, "
              "wall clock, one run each (cold cache): "
              + "; ".join(f"torch {v}: float32 {records[v]['fp32']['seconds']:g} s, bfloat16 "
                          f"{records[v]['bf16']['seconds']:g} s ({records[v]['machine']})"
                          for v in versions) + "."]
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

    def graphs(r: dict | str) -> str:
        return f"`{r}`" if isinstance(r, str) else str(r["graphs"])

    for m in records[versions[-1]]["recompiles"]:
        lines.append(f"| `{m}` | " + " | ".join(
            graphs(records[v]["recompiles"][m]) for v in versions) + " |")
    for m in records[versions[-1]]["full_block"]:
        lines.append(f"| `{m}`, (4, 5) then (4, 16) | " + " | ".join(
            graphs(records[v]["full_block"][m]) for v in versions) + " |")
    last = records[versions[-1]]
    lines += ["", f"The failed guards (torch {versions[-1]}):", ""]
    rows = [(f"`{m}`", r) for m, r in last["recompiles"].items()]
    rows += [(f"`{m}`, a full block after (4, 5)", r) for m, r in last["full_block"].items()]
    for name, r in rows:
        failed = [] if isinstance(r, str) else r["failed_guards"]
        lines.append(f"- {name}: " + ("none" if not failed else
                                      "; ".join(f"`{g}`" for g in failed)))
    return "\n".join(lines)
