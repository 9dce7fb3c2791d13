"""The compact transformer under autocast in both trees: what the tape holds (claim
gpt.autocast_saved_tensors), and the runs its bounds compare (claims gpt.autocast_*).

The reference runs inside reference.amp.autocast, torch inside torch.autocast, on the same
weights; torch's dropout masks are replayed into the reference (parity/drivers/gpt.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from parity.claims import gpt_bounds as gb
from parity.drivers import gpt as dg
from parity.drivers.amp import (
    SUFFIX,
    _gamma2,
    f32,
    float32_accumulation,
    require_members,
)
from parity.drivers.lp_ordinal import rounding_spread
from reference import amp as ramp
from reference import gpt as rgpt
from reference import nn as rnn
from reference.formats import quantize
from reference.layers import Embedding, LayerNorm
from torch_impl import gpt as tgpt
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

FMTS = ("bfloat16", "float16")


def saved_both(config: dg.GPTConfig, fmt: str, idx: np.ndarray, targets: np.ndarray,
               seed: int = 0, device: str = "cpu") -> tuple[Counter, int, Counter, int]:
    """(reference entries, reference held bytes, torch entries, torch held bytes) after one
    float32 forward with targets under `fmt` autocast in both trees (device_type = the
    device's type), on the same weights."""
    kind = torch.device(device).type
    ref, twin = dg.make_pair(config, np.float32, seed, device)
    with ramp.autocast(fmt, kind):
        ref.forward(idx, targets)
    with torch.autocast(kind, dtype=TORCH_DTYPES[fmt]):
        entries, held = tgpt.measure_saved(twin, dg.to_torch_tokens(idx, device),
                                           dg.to_torch_tokens(targets, device))
    return dg.saved_counts(ref.tape()), ref.held_bytes(), dg.saved_counts(entries), held


# -- each op of the transformer under autocast, on the reference's own operands
Pair = tuple[str, str, np.ndarray, np.ndarray, np.ndarray | None]  # claim, where, a, b, k | S
_RECORDED = (rnn.Linear, LayerNorm, Embedding)


def record(model: rgpt.GPT, idx: np.ndarray, targets: np.ndarray, fmt: str, kind: str
           ) -> dict[str, list[np.ndarray]]:
    """One reference forward under `fmt` autocast and its backward, recording for each
    Linear, LayerNorm and Embedding by path [input, output, incoming gradient, returned
    gradient] (the instances' methods are wrapped for this call only)."""
    rec: dict[str, list[np.ndarray]] = {}
    wrapped = []
    for path, m in model.named_modules():
        if not isinstance(m, _RECORDED):
            continue

        def fwd(x: np.ndarray, _f: Callable = m.forward, _p: str = path) -> np.ndarray:
            out = _f(x)
            rec[_p] = [x, out]
            return out

        def bwd(g: np.ndarray, _f: Callable = m.backward, _p: str = path) -> np.ndarray:
            dx = _f(g)
            rec[_p] += [g, dx]
            return dx

        m.forward, m.backward = fwd, bwd  # type: ignore[method-assign]
        wrapped.append(m)
    try:
        model.zero_grad()
        with ramp.autocast(fmt, kind):
            model.forward(idx, targets)
        model.backward()
    finally:
        for m in wrapped:
            del m.forward, m.backward
    return rec


def _t(a: np.ndarray, device: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A reference array (lp arrays widened exactly) as a torch tensor of `dtype` (default:
    the array's own: float32, or the lp dtype it holds)."""
    lp = {np.dtype(v): TORCH_DTYPES[k] for k, v in ramp.LP_DTYPES.items()}.get(a.dtype)
    t = torch.from_numpy(np.ascontiguousarray(a).astype(np.float32 if lp else a.dtype))
    return t.to(device, dtype or lp or t.dtype)


def _linear_pairs(path: str, layer: rnn.Linear, module: torch.nn.Linear,
                  rec: list[np.ndarray], fmt: str, device: str) -> list[Pair]:
    """gpt.autocast_layers: one Linear fed the reference's input and incoming gradient."""
    x, y, g, dx = rec
    claim = f"gpt.autocast_layers_{SUFFIX[fmt]}"
    with float32_accumulation(device), torch.autocast(torch.device(device).type,
                                                      dtype=TORCH_DTYPES[fmt]):
        tx = _t(x, device).requires_grad_()
        ty = module(tx)
    with float32_accumulation(device):
        ty.backward(_t(f32(g), device, TORCH_DTYPES[fmt]))
    n = int(np.prod(x.shape[:-1]))
    x64 = quantize(f32(x), fmt).astype(np.float64).reshape(n, -1)  # what both cast to
    g64 = quantize(f32(g), fmt).astype(np.float64).reshape(n, -1)  # autograd's rounding
    w = quantize(layer.weight.data, fmt).astype(np.float64)
    ax, aw, ag = np.abs(x64), np.abs(w), np.abs(g64)
    b = np.zeros(w.shape[0]) if layer.bias is None else quantize(
        layer.bias.data, fmt).astype(np.float64)
    k_in, k_out = w.shape[1], w.shape[0]
    where = "(logits) " if path == "lm_head" else ""
    out = [
        (claim, f"{path} y {where}", f32(y).reshape(n, -1), f32(ty).reshape(n, -1),
         rounding_spread(x64 @ w.T + b, _gamma2(k_in + 1) * (ax @ aw.T + np.abs(b)), fmt)),
        (claim, f"{path} dx", f32(dx).reshape(n, -1), f32(tx.grad).reshape(n, -1),
         rounding_spread(g64 @ w, _gamma2(k_out) * (ag @ aw), fmt)),
        (claim, f"{path}.weight grad", layer.weight.grad, f32(module.weight.grad),
         rounding_spread(g64.T @ x64, _gamma2(n) * (ag.T @ ax), fmt))]
    if layer.bias is not None:
        out.append((claim, f"{path}.bias grad", layer.bias.grad, f32(module.bias.grad),
                    rounding_spread(g64.sum(0), _gamma2(n) * ag.sum(0), fmt)))
    for _, label, a, bb, _ in out:
        require_members(fmt, f"{path} {label}", a, bb)
    return out


def _float32_pairs(path: str, layer: rnn.Module, module: torch.nn.Module,
                   rec: list[np.ndarray], device: str) -> list[Pair]:
    """A LayerNorm or Embedding of the autocast run (float32 ops: their float32 claims) fed
    the reference's input and incoming gradient."""
    x, y, g, dx = rec
    tx = _t(x, device)
    if isinstance(layer, Embedding):
        module(tx).backward(_t(g, device))
        return [("gpt.embedding", f"{path} y", y, f32(module(tx)), None),
                ("gpt.embedding", f"{path}.weight grad", layer.weight.grad,
                 f32(module.weight.grad), None)]
    tx.requires_grad_()
    ty = module(tx)
    ty.backward(_t(g, device))
    s_dx, s_dw, _ = gb.layer_norm_backward_scales(x, layer.weight.data, g)
    return [("gpt.layer_norm.forward", f"{path} y", y, f32(ty),
             gb.layer_norm_forward_scale(x, layer.weight.data, layer.bias.data)),
            ("gpt.layer_norm.backward", f"{path} dx", dx, f32(tx.grad), s_dx),
            ("gpt.layer_norm.backward", f"{path}.weight grad", layer.weight.grad,
             f32(module.weight.grad), s_dw),
            ("gpt.layer_norm.bias_grad", f"{path}.bias grad", layer.bias.grad,
             f32(module.bias.grad), None)]


def layer_pairs(config: dg.GPTConfig, fmt: str, batch: int, seq_len: int, seed: int,
                device: str = "cpu") -> tuple[list[Pair], set[str], set[str]]:
    """Every Linear (the logits among them), LayerNorm and Embedding of one reference run
    under `fmt` autocast (forward with targets, backward), each torch module fed the
    reference's input and incoming gradient: (pairs, parameter names compared, all
    parameter names). Untied weights, so each gradient is one module's."""
    config = replace(config, tie_weights=False)
    ref, twin = dg.make_pair(config, np.float32, seed % 1000, device, affine=True)
    twin.train(ref.training)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    rec = record(ref, idx, targets, fmt, torch.device(device).type)
    mods = dict(twin.named_modules())
    pairs: list[Pair] = []
    for path, layer in ref.named_modules():
        if path in rec and isinstance(layer, rnn.Linear):
            pairs += _linear_pairs(path, layer, mods[path], rec[path], fmt, device)
        elif path in rec:
            pairs += _float32_pairs(path, layer, mods[path], rec[path], device)
    compared = {where.split(" ")[0] for _, where, *_ in pairs if where.endswith(" grad")}
    return pairs, compared, {name for name, _ in ref.named_parameters()}


def autocast_totals(batch: int = 4) -> list[tuple[str, str, float, int, int]]:
    """(precision, device type of the lists, dropout, tape entries, held bytes) of the
    reference's tape for the default config, batch x block_size tokens. The "cuda" rows are
    the reference's emulation of torch's CUDA lists (not compared with torch here)."""
    out = []
    for fmt, kind in ((None, "cpu"), ("bfloat16", "cpu"), ("float16", "cpu"),
                      ("bfloat16", "cuda")):
        for dropout in (0.0, 0.1):
            config = replace(dg.GPTConfig(), dropout=dropout)
            model = rgpt.GPT(config, rng=np.random.default_rng(0))
            idx, targets = dg.tokens(config, batch, config.block_size, 0)
            with ramp.autocast(fmt, kind):
                model.forward(idx, targets)
            out.append((fmt or "float32", kind, dropout, len(model.tape()), model.held_bytes()))
    return out
