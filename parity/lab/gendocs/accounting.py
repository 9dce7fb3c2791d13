"""docs/accounting.md: the prediction sheets, the MLP's saved tensors term by term, the
reconciliation of one MLP step in both trees, the approximations (the transformer's
Korthikanti table and reconciliation: parity/lab/gendocs/accounting_gpt.py). Byte
counts and FLOPs are integers the code computes (no timing), so they are rendered afresh."""

from __future__ import annotations

import dataclasses

from parity.drivers import accounting as drv
from parity.lab.gendocs import section
from reference import accounting as racc
from reference import flops as rflops
from reference.flops_published import flop_approximations

RECONCILED = (drv.MLPCase(),
              drv.MLPCase(activation="gelu", dropout=0.1, precision="bf16", optimizer="adam",
                          recompute="sqrt"))
TERMS_CASE = drv.MLPCase(activation="gelu", dropout=0.1)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _sheet(rows: list[drv.Row], trees: tuple[str, ...]) -> list[str]:
    head = "| quantity | predicted |" + "".join(f" {t} | gap | term |" for t in trees)
    lines = [head + " formula |", "|---|---:|" + "---:|---:|---|" * len(trees) + "---|"]
    for r in rows:
        cells = "".join(f" {_n(r.measured.get(t))} | {_n(r.gap(t)) if r.gap(t) else ''} | "
                        f"{r.terms.get(t, '')} |" for t in trees)
        lines.append(f"| {r.section}: {r.name} | {_n(r.predicted)} |{cells} {r.formula} |")
    return lines


@section("accounting.md", "mlp-reconciliation")
def _() -> str:
    out = []
    for case in RECONCILED:
        rows = drv.predict_mlp(case)
        drv.reconcile(rows, case, drv.torch_step(case), drv.reference_step(case))
        t = drv.totals(rows, case.n_params)
        out += [f"`{case}`: {case.n_params:,} parameters, {t['bytes_per_param']} bytes per "
                f"parameter (training_memory), {t['memory']:,} bytes and {t['flops']:,} FLOPs "
                "predicted.", "", *_sheet(rows, ("torch", "reference")), ""]
    return "\n".join(out)


@section("accounting.md", "mlp-terms")
def _() -> str:
    c = TERMS_CASE
    layers = rflops.mlp_layers(c.sizes, c.activation, c.dropout)
    kw = {"activation": c.activation, "dropout": c.dropout}
    tables = {p: racc.mlp_saved(c.sizes, c.batch, precision=p, **kw)[0]
              for p in ("fp32", "bf16")}
    lines = [f"make_mlp({c.sizes}, {c.activation!r}, dropout={c.dropout}), batch {c.batch}, "
             "training, the data not requiring grad. A tensor saved twice is held once (the "
             "`tensor` column names it).", "",
             "| layer | saves | tensor (fp32) | shape | fp32 bytes | tensor (bf16 autocast) | "
             "shape | bf16 bytes |", "|---|---|---|---|---:|---|---|---:|"]
    fp32, bf16 = tables["fp32"], tables["bf16"]
    keys = sorted({(e.layer, e.name) for e in fp32 + bf16},
                  key=lambda k: (k[0], ("input", "weight", "result", "self", "mask").index(k[1])))
    for layer, name in keys:
        a = next((e for e in fp32 if (e.layer, e.name) == (layer, name)), None)
        b = next((e for e in bf16 if (e.layer, e.name) == (layer, name)), None)
        cols = [f"`{e.tensor}` | {e.shape} | {e.nbytes:,}" if e else "- | - | 0" for e in (a, b)]
        lines.append(f"| {layer} {layers[layer]} | {name} | {cols[0]} | {cols[1]} |")
    measured = {p: drv.torch_step(drv.MLPCase(**{**kw, "sizes": c.sizes, "batch": c.batch,
                                                 "precision": p}))["held"]["model"]
                for p in ("fp32", "bf16")}
    tape = {p: drv.reference_step(dataclasses.replace(c, precision=p))["held"]["model"]  # type: ignore[index]
            for p in ("fp32", "bf16")}
    extra = drv.first_weight_cast(dataclasses.replace(c, precision="bf16"))
    lines.append(f"| held (distinct) | | | | **{racc.held_bytes(fp32):,}** | | | "
                 f"**{racc.held_bytes(bf16):,}** |")
    lines += ["", f"Measured: torch's saved_tensors_hooks hold {measured['fp32']:,} bytes in "
              f"fp32 and {measured['bf16']:,} in bf16; the reference tape {tape['fp32']:,} in "
              f"fp32 and {tape['bf16']:,} in bf16 (its lp tensors are 2-byte arrays; it also "
              f"keeps the first Linear's weight cast, {extra:,} bytes, for the input gradient it "
              "always computes, which torch's addmm does not save when the data needs no grad)."]
    return "\n".join(lines)


@section("accounting.md", "gpt-sheet")
def _() -> str:
    from parity.drivers.accounting_gpt import gpt_sheet

    case = drv.GPTCase(precision="bf16", recompute="none")
    rows = gpt_sheet(case)
    t = drv.totals(rows, case.n_params)
    return "\n".join([f"`{case}`: {case.n_params:,} parameters, {t['bytes_per_param']} bytes "
                      "per parameter (training_memory).", "", *_sheet(rows, ())])


@section("accounting.md", "approximations")
def _() -> str:
    lines = ["| model | s | exact (transformer_flops) | approximation | its count | "
             "difference |", "|---|---:|---:|---|---:|---:|"]
    for label, n_layer, width, heads, s in (("GPT-2 small", 12, 768, 12, 1024),
                                            ("GPT-2 small", 12, 768, 12, 8192),
                                            ("GPT-3 175B", 96, 12288, 96, 2048)):
        for a in flop_approximations(n_layer=n_layer, d_model=width, n_head=heads,
                                            seq_len=s, vocab=50257, batch=1):
            lines.append(f"| {label} | {s} | {a.exact:.4e} | {a.name}: {a.formula} | "
                         f"{a.flops:.4e} | {float(a.relative):+.2%} |")
    return "\n".join(lines)
