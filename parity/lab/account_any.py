"""A user's model beside the closed forms: parity/lab/your_trainer/accounting_any.py measures
it; when it is GPT-2-shaped (NOTE [ Recognizing a GPT-2-shaped decoder ] there), each measured
total is set beside the formula this project checks for its own transformer, and every
difference is a named term with its own closed form, so that

    measured == formula + sum(named terms)        (the residual, which must be 0)

# NOTE [ GPT-2 beside the closed forms ]
B sequences of T tokens, L blocks of width h, a heads, f = d_ff, V the vocabulary, e the
activations' itemsize (the parameters' dtype: no autocast here).
  parameters  gpt_param_count(L, h, V, positions, f, bias, tied): no term. transformers'
              Conv1D stores (in, out), nn.Linear (out, in): transposed, the same count; a
              tied head is one Parameter, counted once by both.
  FLOPs       transformer_flops(...): 3 forward passes of GEMMs, 72 B T L h^2 (1 + T/6h +
              V/12hL) for f = 4h. Term "attention core not counted": when the blocks'
              attention modules count no FLOPs beyond their projections (a fused SDPA
              kernel FlopCounterMode has no formula for, as on the CPU), -3 L 4 B T^2 h.
              Kaplan's 6 N D is printed beside it (no s^2 term, no head): not reconciled.
  activations gpt_activation_bytes(..., itemsize e), this project's block saved exactly
              (Korthikanti's 34 s b h + 5 a s^2 b per layer is its 16-bit relative, term by
              term in docs/accounting.md). Terms, each selected by what the model saved:
                "no saved causal mask": the project's core saves a fresh (1, 1, T, T) bool
                  (masked_fill); a core that adds a float mask saves none: -L T^2;
                "composite GELU": nn.GELU saves its input once; a GELU written as
                  elementwise ops (transformers' NewGELUActivation: pow saves x, tanh its
                  result, and the two products 0.5 x and 1 + tanh) saves k tensors of
                  (B, T, f): +(k - 1) L B T f e, k counted in block 0's activation module;
                "SDPA core (CPU flash kernel)": selected by a saved (B, a, T) float32
                  log-sum-exp; the kernel saves q, k, v, its output (the very storage
                  c_proj then saves) and the log-sum-exp, never the (T, T) probabilities:
                  + L (4 B a T - B a T^2 e) beside the project's q, k^T, P, v.
              Dropout p > 0 or a 16-bit model: the activation rows are left out (HF's
              attention dropout is functional, not a module); parameters and FLOPs stay.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from parity.lab.your_trainer.accounting_any import (
    GPT2Shape,
    ModuleAccount,
    NotGPT2,
    account_module,
    gpt2_shape,
)
from reference.accounting import activation_bytes
from reference.accounting_gpt import gpt_activation_bytes
from reference.flops import gpt_param_count, transformer_flops, transformer_forward_flops
from reference.flops_published import kaplan_flops


@dataclass
class Line:
    """One quantity: measured, the closed form, the named terms between them."""

    name: str
    measured: int
    formula: int
    formula_name: str
    terms: dict[str, int] = field(default_factory=dict)

    @property
    def residual(self) -> int:
        return self.measured - self.formula - sum(self.terms.values())


PROJECTION_OPS = ("mm", "addmm")  # a Linear or Conv1D; the core's products are batched


def _attention_core_flops(shape: GPT2Shape, account: ModuleAccount) -> int:
    """The attention modules' FLOPs in ops other than a projection's, over the blocks."""
    return sum(n for path in shape.attention for op, n in account.ops.get(path, {}).items()
               if op not in PROJECTION_OPS)


def _gelu_saves(shape: GPT2Shape, account: ModuleAccount) -> int:
    """How many (B, T, f) tensors block 0's MLP activation module saved."""
    want = (shape.batch, shape.seq_len, shape.d_ff)
    return sum(1 for e in account.saved if e.module == shape.mlp_act[0] and e.shape == want)


def _sdpa_saved(shape: GPT2Shape, account: ModuleAccount) -> bool:
    """Block 0's attention saved a (B, a, T) float32 log-sum-exp: a fused SDPA core."""
    want = (shape.batch, shape.n_head, shape.seq_len)
    return any(e.module.startswith(shape.attention[0]) and e.shape == want
               and e.nbytes == 4 * shape.batch * shape.n_head * shape.seq_len
               for e in account.saved)


def _mask_saved(shape: GPT2Shape, account: ModuleAccount) -> bool:
    T = shape.seq_len
    return any(e.module.startswith(shape.attention[0]) and e.shape[-2:] == (T, T)
               and e.nbytes == T * T for e in account.saved)


def gpt2_lines(shape: GPT2Shape, account: ModuleAccount, dropout: float = 0.0) -> list[Line]:
    """parameters, FLOPs, activations beside their closed forms (NOTE [ GPT-2 beside the
    closed forms ]); Korthikanti's and Kaplan's rows carry no terms (printed, not
    reconciled). The activation rows only where activation_refusal says nothing."""
    L, h, a, f, V = shape.n_layer, shape.d_model, shape.n_head, shape.d_ff, shape.vocab
    B, T = shape.batch, shape.seq_len
    gpt = {"n_layer": L, "d_model": h, "n_head": a, "seq_len": T, "vocab": V, "batch": B}
    lines = [Line("parameters", account.n_params,
                  gpt_param_count(L, h, V, shape.n_positions, d_ff=f, bias=shape.bias,
                                  tie_weights=shape.tied), "gpt_param_count")]
    flops = Line("flops", account.total_flops, transformer_flops(**gpt, d_ff=f),
                 "transformer_flops (72 B s L h^2 (1 + s/6h + V/12hL) for f = 4h)")
    if _attention_core_flops(shape, account) == 0:
        core = transformer_forward_flops(**gpt, d_ff=f)["attention"]
        flops.terms["attention core not counted (SDPA kernel)"] = -3 * core
    lines.append(flops)
    lines.append(Line("flops: 6ND", account.total_flops,
                      kaplan_flops(n_layer=L, d_model=h, seq_len=T, batch=B, d_ff=f),
                      "kaplan_flops (6 N D; not reconciled)"))
    if activation_refusal(shape, dropout):
        return lines
    e = torch.empty((), dtype=shape.dtype).element_size()
    acts = Line("activations", sum(account.activations.values()),
                gpt_activation_bytes(**gpt, bias=shape.bias, itemsize=e)["total"],
                f"gpt_activation_bytes (this project's block, {e}-byte activations)")
    if not _mask_saved(shape, account):
        acts.terms["no saved causal mask"] = -L * T * T
    if _sdpa_saved(shape, account):
        acts.terms["SDPA core (CPU flash kernel)"] = L * (4 * B * a * T - B * a * T * T * e)
    k = _gelu_saves(shape, account)
    if k != 1:
        acts.terms[f"composite GELU ({k} saves)"] = (k - 1) * L * B * T * f * e
    lines.append(acts)
    lines.append(Line("activations: Korthikanti", sum(account.activations.values()),
                      activation_bytes(seq_len=T, batch=B, hidden=h, n_head=a, n_layer=L),
                      "activation_bytes (16-bit, 1-byte masks; not reconciled)"))
    return lines


def activation_refusal(shape: GPT2Shape, dropout: float) -> str:
    """Why the activation rows are left out ('' when they are not)."""
    if dropout:
        return (f"activations not compared: dropout {dropout}; the terms are stated for "
                "p == 0 (transformers' attention dropout is functional, not a module)")
    if shape.dtype not in (torch.float32, torch.float64):
        return (f"activations not compared: parameters in {shape.dtype}; the formula is "
                "stated for float32 and float64 models")
    return ""


RECONCILED = ("parameters", "flops", "activations")


def load_factory(spec: str) -> Any:
    """'pkg.mod:factory' -> the callable (ValueError naming what is missing)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--module {spec!r}: accepted: PKG.MOD:FACTORY (a callable returning "
                         "(model, example_batch))")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"--module {spec!r}: cannot import {module_name!r}: {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--module {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def try_gpt2(model: Any, batch: Any, account: ModuleAccount) -> tuple[list[Line], str]:
    """(lines, what was left out) for a GPT-2-shaped model, ([], the rule it breaks)
    otherwise."""
    try:
        shape = gpt2_shape(model, batch)
    except NotGPT2 as err:
        return [], str(err)
    dropout = max((m.p for m in model.modules() if isinstance(m, nn.Dropout)), default=0.0)
    return gpt2_lines(shape, account, dropout), activation_refusal(shape, dropout)


# ---------------------------------------------------------------- python -m parity account --module
CATEGORIES = ("params", "grads", "optimizer_state", "buffers", "activations")


def build(spec: str, batch_shape: tuple[int, ...] | None) -> tuple[Any, Any, Any]:
    """(model, example_batch, loss_fn or None) from the factory `spec` names; the factory is
    called with batch_shape=(B, T) when --batch-shape is given, with nothing otherwise."""
    factory = load_factory(spec)
    made = factory() if batch_shape is None else factory(batch_shape=batch_shape)
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise ValueError(f"--module {spec}: the factory returned {type(made).__name__}; "
                         "accepted: (model, example_batch) or (model, example_batch, loss_fn)")
    if not isinstance(made[0], nn.Module):
        raise ValueError(f"--module {spec}: the factory's model is {type(made[0]).__name__}, "
                         "not an nn.Module")
    return made[0], made[1], made[2] if len(made) == 3 else None


def module_report(spec: str, batch_shape: tuple[int, ...] | None, optimizer: str
                  ) -> dict[str, Any]:
    """Measure one step of the factory's model; the GPT-2 lines when it is recognized."""
    from parity.drivers.accounting import OPTIMIZERS

    model, batch, loss_fn = build(spec, batch_shape)
    cls, kw = OPTIMIZERS[optimizer]
    opt = getattr(torch.optim, cls)(model.parameters(), **kw)
    account = account_module(model, batch, loss_fn=loss_fn, optimizer=opt)
    lines, note = try_gpt2(model, batch, account)
    order = {p: i for i, (p, _) in enumerate(model.named_modules())}
    paths = sorted({p for c in CATEGORIES for p in getattr(account, c)}
                   | set(account.flops_forward),
                   key=lambda p: order.get(p, len(order)))  # "(outside)" last
    per_module = [{"module": p or "(root)", **{c: getattr(account, c).get(p, 0)
                                                 for c in CATEGORIES},
                   "flops_forward": account.flops_forward.get(p, 0)} for p in paths]
    return {"module": spec, "per_module": per_module, "totals": account.totals(),
            "gpt2": None if not lines else [
                {"quantity": ln.name, "measured": ln.measured, "formula": ln.formula,
                 "formula_name": ln.formula_name, "terms": ln.terms,
                 "residual": ln.residual if ln.name in RECONCILED else None}
                for ln in lines],
            "not_gpt2": None if lines else note, "note": note if lines else None,
            "unexplained": sum(1 for ln in lines if ln.name in RECONCILED and ln.residual)}


def render_report(report: dict[str, Any]) -> str:
    """The per-module table (forward FLOPs, the module's children included), then the
    GPT-2 lines."""
    head = ["module", *CATEGORIES, "flops_forward"]
    rows = [[r["module"], *(f"{r[c]:,}" for c in [*CATEGORIES, "flops_forward"])]
            for r in report["per_module"]]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                     for i, (v, w) in enumerate(zip(x, widths, strict=True))).rstrip()
           for x in [head, *rows]]
    if report["gpt2"] is None:
        out.append(f"\nnot GPT-2-shaped, so no closed form beside it: {report['not_gpt2']}")
        return "\n".join(out)
    out.append("\nGPT-2-shaped: measured = formula + named terms (+ residual)")
    if report["note"]:
        out.append(f"  ({report['note']})")
    for ln in report["gpt2"]:
        terms = "".join(f" {'+' if n >= 0 else '-'} {abs(n):,} ({k})"
                        for k, n in ln["terms"].items())
        tail = "" if ln["residual"] is None else f"  residual {ln['residual']:,}"
        out.append(f"  {ln['quantity']}: {ln['measured']:,} = {ln['formula']:,} "
                   f"[{ln['formula_name']}]{terms}{tail}")
    return "\n".join(out)
