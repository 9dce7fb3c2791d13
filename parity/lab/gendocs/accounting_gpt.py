"""docs/accounting.md, the transformer's parts: Korthikanti's terms against this project's
block (from gpt_saved: formulas, deterministic) and the measured reconciliation of the
default transformer (from docs/data/accounting_gpt.json, written by
`python -m parity.drivers.accounting_gpt`)."""

from __future__ import annotations

import json

from parity.drivers import accounting_gpt as dgpt
from parity.lab.gendocs import section
from reference import accounting as racc
from reference import accounting_gpt as ragpt

# gpt_saved's entries of one block (module path below transformer.h.0, node attribute) ->
# the Korthikanti term they realize, or None: a term of ours that Korthikanti does not have
TERM_OF = {
    ("attn.c_attn", "AddmmBackward0.mat1"): "attention: QKV input (LayerNorm output)",
    ("attn.core", "BmmBackward0.self:q"): "attention: q and k (QK^T inputs)",
    ("attn.core", "BmmBackward0.mat2:kT"): "attention: q and k (QK^T inputs)",
    ("attn.core", "SoftmaxBackward0.result"): "attention: softmax output",
    ("attn.core.attn_dropout", "MulBackward0.other"): "attention: softmax dropout mask",
    ("attn.core", "BmmBackward0.self:att"): "attention: dropout output (att @ v input)",
    ("attn.core", "BmmBackward0.mat2:v"): "attention: v",
    ("attn.c_proj", "AddmmBackward0.mat1"): "attention: projection input",
    ("attn.resid_dropout", "MulBackward0.other"): "attention: residual dropout mask",
    ("mlp.c_fc", "AddmmBackward0.mat1"): "mlp: first Linear input (LayerNorm output)",
    ("mlp.gelu", "GeluBackward0.self"): "mlp: GELU input",
    ("mlp.c_proj", "AddmmBackward0.mat1"): "mlp: second Linear input",
    ("mlp.dropout", "MulBackward0.other"): "mlp: dropout mask",
    ("ln_1", "NativeLayerNormBackward0.input"): "layernorm: the two LayerNorm inputs",
    ("ln_2", "NativeLayerNormBackward0.input"): "layernorm: the two LayerNorm inputs",
}
EXTRA = "ours only"
WHY = {
    "attention: softmax dropout mask": "torch's CPU dropout saves the scaled keep-mask in the "
                                       "input's dtype (2 bytes); CUDA's fused kernel a bool (1)",
    "attention: residual dropout mask": "the same: 2 bytes on the CPU",
    "mlp: dropout mask": "the same: 2 bytes on the CPU",
    "layernorm: the two LayerNorm inputs": "autocast keeps the residual stream float32: "
                                           "4 bytes, not 2",
    "attention: QKV input (LayerNorm output)": "LayerNorm runs float32 under autocast; the "
                                               "GEMM saves its bf16 cast",
    "mlp: first Linear input (LayerNorm output)": "the same: the bf16 cast is saved",
}
SHAPE = {"n_layer": 1, "d_model": 768, "n_head": 12, "seq_len": 1024, "vocab": 50257,
         "batch": 8}


def _key(entry: racc.Saved) -> tuple[str, str]:
    module = str(entry.layer).removeprefix("transformer.h.0.")
    if entry.name.startswith("BmmBackward0"):
        return module, f"{entry.name}:{entry.tensor.rsplit('.', 1)[-1].replace('out', 'att')}"
    return module, entry.name


def block_terms(dropout: float = 0.1, precision: str = "bf16") -> dict[str, list[racc.Saved]]:
    """Block 0's distinct saved tensors grouped by the Korthikanti term they realize (EXTRA:
    ours only); a tensor saved twice is listed under its first term."""
    saved, _ = ragpt.gpt_saved(**SHAPE, dropout=dropout, precision=precision)
    seen: set[str] = set()
    groups: dict[str, list[racc.Saved]] = {name: [] for name in racc.KORTHIKANTI_TERMS}
    groups[EXTRA] = []
    for e in saved:
        if not str(e.layer).startswith("transformer.h.0") or e.tensor in seen:
            continue
        seen.add(e.tensor)
        groups[TERM_OF.get(_key(e), EXTRA)].append(e)
    return groups


def _short(tensor: str) -> str:
    return tensor.replace("transformer.h.0.", "").replace("transformer.", "")


def _sbh(nbytes: int) -> str:
    s, b, h = SHAPE["seq_len"], SHAPE["batch"], SHAPE["d_model"]
    return f"{nbytes / (s * b * h):g} sbh"


@section("accounting.md", "korthikanti")
def _() -> str:
    s, b, h, a = SHAPE["seq_len"], SHAPE["batch"], SHAPE["d_model"], SHAPE["n_head"]
    theirs = racc.korthikanti_terms(seq_len=s, batch=b, hidden=h, n_head=a)
    ours = block_terms()
    lines = [f"One layer of GPT-2 small's shape (s {s}, b {b}, h {h}, a {a}). Korthikanti: "
             "16-bit activations, 1-byte masks. Ours: this project's block (gpt_saved) under "
             "bf16 autocast on the CPU, dropout 0.1; each tensor counted once (names inside "
             "block 0; `drop.out`, the embedding dropout's output, is block 0's input).", "",
             "| Korthikanti term | coefficient | their bytes | our tensors | our bytes | "
             "why it differs |", "|---|---|---:|---|---:|---|"]
    for name, (c1, c2) in racc.KORTHIKANTI_TERMS.items():
        coeff = " + ".join(x for x in (f"{c1} sbh" if c1 else "", f"{c2} as²b" if c2 else "")
                           if x)
        mine = sum(e.nbytes for e in ours[name])
        tensors = ", ".join(f"`{_short(e.tensor)}` {e.itemsize}B" for e in ours[name])
        why = WHY.get(name, "same" if mine == theirs[name] else "")
        lines.append(f"| {name} | {coeff} | {theirs[name]:,} | {tensors} | {mine:,} | {why} |")
    extra = ours[EXTRA]
    lines.append("| (none) | | 0 | "
                 + ", ".join(f"`{_short(e.tensor)}` {e.shape}" for e in extra)
                 + f" | {sum(e.nbytes for e in extra):,} | LayerNorm's float32 mean and rstd "
                 "(16 sb), the fresh (1, 1, T, T) bool causal mask (s²), autocast's bf16 weight "
                 "casts (24 h², a view of the parameter in Megatron's bf16 model) |")
    total = sum(e.nbytes for group in ours.values() for e in group)
    lines.append(f"| total | s b h (34 + 5 a s / h) | **{sum(theirs.values()):,}** | | "
                 f"**{total:,}** ({_sbh(total)}) | |")
    return "\n".join(lines)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


@section("accounting.md", "gpt-reconciliation")
def _() -> str:
    data = json.loads(dgpt.DATA.read_text())
    out = [f"Measured with torch {data['torch']} (`python -m parity.drivers.accounting_gpt` "
           "rewrites `docs/data/accounting_gpt.json`; a test re-measures the first case).", ""]
    for case in data["cases"]:
        c = case["config"]
        shown = ", ".join(f"{k}={c[k]}" for k in ("n_layer", "d_model", "n_head", "seq_len",
                                                   "vocab", "batch", "dropout", "precision",
                                                   "optimizer", "recompute"))
        out += [f"`{shown}`: {case['n_params']:,} parameters.", "",
                "| quantity | predicted | torch | reference | formula |",
                "|---|---:|---:|---:|---|"]
        for r in case["rows"]:
            m = r["measured"]
            out.append(f"| {r['section']}: {r['name']} | {_n(r['predicted'])} | "
                       f"{_n(m.get('torch'))} | {_n(m.get('reference'))} | {r['formula']} |")
        out.append("")
    out.append(f"Reference: {dgpt.REFERENCE_GPT_LIMITS}; its forward FLOPs are its tape's own "
               "count; `-` marks what a tree does not measure. Korthikanti's row is the "
               "published estimate beside ours, not a measurement.")
    return "\n".join(out)
