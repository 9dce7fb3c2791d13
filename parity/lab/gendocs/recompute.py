"""docs/recompute.md: recompute counts per schedule (run by the reference), the measured
trade-off (from docs/data/recompute_benchmark.json) and the claim table.

`claims_table(topic)` renders any topic's claims (docs/data.md uses it too)."""

from __future__ import annotations

from parity.drivers.recompute import BENCH_UNITS, chain, n_layers, theory_time_ratio
from parity.lab.gendocs import section
from parity.tolerances import CLAIMS

COUNT_SPECS = ("sqrt", "uniform:2", "uniform:4", "optimal:1", "optimal:2", "optimal:3",
               "optimal:4", "optimal:8")


def claims_table(topic: str) -> str:
    """The claims of a topic as a markdown table: id, statement, tolerance."""
    rows = ["| claim | statement | tolerance |", "|---|---|---|"]
    rows += [f"| `{c.id}` | {c.statement.replace('|', chr(92) + '|')} | {c.tolerance} |"
             for c in CLAIMS if c.topic == topic]
    return "\n".join(rows)


@section("recompute.md", "recompute-counts")
def _() -> str:
    from parity.drivers.recompute import tanh_chain_recomputes

    ns = [n_layers(chain(units, 1)) for units in BENCH_UNITS]
    head = "| n | " + " | ".join(f"`{s}`" for s in COUNT_SPECS) + " |"
    lines = [head, "|---:|" + "---:|" * len(COUNT_SPECS)]
    for n in ns:
        lines.append(f"| {n} | " + " | ".join(str(tanh_chain_recomputes(s, n))
                                               for s in COUNT_SPECS) + " |")
    return ("R, the layer forwards recomputed during backward, for the benchmark's chains of "
            "n modules (counted by running the reference on a chain of n Tanh layers):\n\n"
            + "\n".join(lines))


@section("recompute.md", "benchmark")
def _() -> str:
    from parity.lab.pictures.recompute import BENCH_JSON, load_benchmark

    bench = load_benchmark()
    if bench is None:
        return f"No measurements committed ({BENCH_JSON.name} is missing)."
    head = ("| n | schedule | held | R / n | theory 1 + R/(3n) | torch: median [IQR] | "
            "reference: median [IQR] |")
    lines = [head, "|---:|---|---:|---:|---:|---:|---:|"]
    for r in bench["rows"]:
        if r["spec"] == "none":
            continue
        cells = [str(r["n"]), f"`{r['spec']}`", f"{r['held_ratio']:.3f}",
                 f"{r['recompute_fraction']:.2f}",
                 f"{theory_time_ratio(r['recompute_fraction']):.2f}"]
        for side in ("torch", "reference"):
            s = r[f"{side}_time_ratio"]
            cells.append(f"{s['median']:.2f} [{s['q1']:.2f}, {s['q3']:.2f}]")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Measured median over prediction, range over the chains and schedules of a "
              "kind (1 + R/(3n): a backward costs two forwards; 1 + R/(2n): one), and the "
              "interquartile range relative to the median:", "",
              "| implementation | schedules | median / (1 + R/(3n)) | median / (1 + R/(2n)) | "
              "IQR / median |", "|---|---|---|---|---|"]
    for side in ("torch", "reference"):
        for kind, revolve in (("uniform:K, sqrt", False), ("optimal:S", True)):
            rows = [r for r in bench["rows"]
                    if r["spec"] != "none" and r["spec"].startswith("optimal:") == revolve]
            cols = [[r[f"{side}_time_ratio"]["median"] / (1 + r["recompute_fraction"] / d)
                     for r in rows] for d in (3, 2)]
            cols.append([(r[f"{side}_time_ratio"]["q3"] - r[f"{side}_time_ratio"]["q1"])
                         / r[f"{side}_time_ratio"]["median"] for r in rows])
            lines.append(f"| {side} | {kind} | "
                         + " | ".join(f"{min(c):.2f}-{max(c):.2f}" for c in cols) + " |")
    return (f"Measured by `python benchmarks/recompute.py --write` ({bench['repeats']} "
            f"interleaved rounds; {bench['method']}; {bench['machine']}, torch "
            f"{bench['torch']}, NumPy {bench['numpy']}; width {bench['width']}, batch "
            f"{bench['batch']}, {bench['dtype']}). Time columns: the ratio to `none` of the "
            "same chain and implementation, median over rounds and interquartile range.\n\n"
            + "\n".join(lines))


@section("recompute.md", "claims")
def _() -> str:
    return claims_table("recompute")


GPT_TABLES = (  # (what, config keywords, batch, seq_len)
    ("`train --model gpt`'s transformer (4 blocks, width 32, 2 heads), B = 16, T = 16",
     {"n_layer": 4, "dropout": 0.1}, 16, 16),
    ("the same with a longer context, B = 4, T = 64", {"n_layer": 4, "dropout": 0.1,
                                                       "block_size": 64}, 4, 64),
)


@section("recompute.md", "gpt-recompute")
def _() -> str:
    from common.gpt_config import GPTConfig
    from parity.drivers.recompute_gpt import recompute_rows

    out = []
    for what, keywords, batch, seq_len in GPT_TABLES:
        rows = recompute_rows(GPTConfig(**keywords), batch, seq_len)
        base = rows[0]["held"]
        lines = ["| spec | held bytes (tape = hooks) | held / none | extra forward FLOPs | "
                 "extra / blocks' forward |", "|---|---:|---:|---:|---:|"]
        for r in rows:
            held = f"{r['held']:,}" if r["held"] == r["torch_held"] else \
                f"{r['held']:,} (torch {r['torch_held']:,})"
            lines.append(f"| `{r['spec']}` | {held} | {r['held'] / base:.2f} | "
                         f"{r['extra_forward_flops']:,} | "
                         f"{r['extra_forward_flops'] / r['forward_flops']:.2f} |")
        out.append(f"{what}, float32, dropout 0.1:\n\n" + "\n".join(lines))
    return ("Held bytes: distinct storages on the reference's tape after forward (parameters "
            "excluded), equal to torch's saved_tensors_hooks in every row (claim "
            "`recompute.gpt_held_bytes`; the loss's and the head's tapes included). Extra "
            "forward FLOPs: the matmul FLOPs (2 m n k each, reference.gpt.matmuls) of the "
            "forwards backward re-runs: R blocks for a block schedule (R counted as in the "
            "table above, over n_layer blocks), plus one attention core per block for "
            "selective.\n\n" + "\n\n".join(out))
