"""The gpt claims' comparisons, op by op: each op fed torch's own inputs (layerwise), and
along one whole run with the measured differences carried (parity/claims/gpt.py: gpt.logits,
gpt.grads); each returns (claim, where, reference, torch, S) pairs that tests assert and
report checks measure. Running the trees: parity/drivers/gpt.py; the scales:
parity/claims/gpt_bounds.py.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np
import torch

from parity.claims import gpt_bounds as gb
from parity.drivers.gpt import (
    GPTConfig,
    TorchRun,
    make_pair,
    replay_masks,
    run_ref,
    run_torch,
    sdpa_core_scale,
    tokens,
)
from parity.drivers.nn import TORCH_DTYPE, linear_scales
from parity.drivers.nn import run_ref as run_ref_layer
from parity.tolerances import claim
from reference import amp as ramp
from reference import attention as rattn
from reference import gpt as rgpt
from reference import nn as rnn
from reference.layers import Embedding, LayerNorm, layer_norm
from torch_impl import gpt as tgpt
from torch_impl.state_mapping import state_dict_to_torch

_RECORDED = (rnn.Linear, rnn.GELU, LayerNorm, rattn.AttentionCore)


def record_ref(model: rgpt.GPT, idx: np.ndarray, targets: np.ndarray,
               keeps: dict[str, np.ndarray], backward: bool = False,
               autocast: tuple[str, str] | None = None
               ) -> tuple[dict[str, tuple[list[np.ndarray], np.ndarray]], dict[str, np.ndarray]]:
    """One reference forward with torch's masks replayed, recording each LayerNorm, Linear,
    GELU and attention core's inputs and output by module path, and with `backward` the
    backward too, recording the incoming gradient of each LayerNorm, Linear and Embedding
    (the instances' methods are wrapped for this call only). `autocast`: (format, device
    type) of reference.amp.autocast around the forward."""
    replay_masks(model, keeps)
    seen: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}
    gouts: dict[str, np.ndarray] = {}
    wrapped = []
    for path, m in model.named_modules():
        if isinstance(m, _RECORDED):
            def rec(*args: np.ndarray, _f: Callable = m.forward, _p: str = path) -> np.ndarray:
                out = _f(*args)
                seen[_p] = (list(args), out)
                return out

            m.forward = rec  # type: ignore[method-assign]
            wrapped.append((m, "forward"))
        if backward and isinstance(m, rnn.Linear | LayerNorm | Embedding):
            def rec_back(g: np.ndarray, _f: Callable = m.backward, _p: str = path) -> object:
                gouts[_p] = g
                return _f(g)

            m.backward = rec_back  # type: ignore[method-assign]
            wrapped.append((m, "backward"))
    try:
        model.zero_grad()
        with ramp.autocast(*(autocast or (None, "cpu"))):
            model.forward(idx, targets)
        if backward:
            model.backward()
    finally:
        for m, name in wrapped:
            delattr(m, name)
        model.free_saved()
    return seen, gouts


def carried_scale(module: rnn.Module, ins: list[np.ndarray], t_ins: list[np.ndarray],
                  noise: np.ndarray | None, gelu_bound: float) -> np.ndarray:
    """S for one op's output along a run: its own budget at torch's inputs plus the measured
    difference of its inputs (in eps) carried through |its Jacobian| (gpt.logits)."""
    eps = float(np.finfo(ins[0].dtype).eps)
    e = [np.abs(a.astype(np.float64) - b.astype(np.float64)) / eps
         for a, b in zip(ins, t_ins, strict=True)]
    if isinstance(module, LayerNorm):
        return gb.layer_norm_forward_scale(t_ins[0], module.weight.data, module.bias.data, e[0])
    if isinstance(module, rattn.AttentionCore):
        return gb.attention_forward_scale(*t_ins, noise, *e)[0]
    if isinstance(module, rnn.GELU):
        return gb.GELU_LIPSCHITZ * e[0] + gelu_bound * np.abs(t_ins[0].astype(np.float64))
    b = None if module.bias is None else module.bias.data  # type: ignore[attr-defined]
    return gb.linear_carried(t_ins[0], e[0], module.weight.data, b)  # type: ignore[attr-defined]


Pair = tuple[str, str, np.ndarray, np.ndarray, np.ndarray | None]  # claim, where, a, b, S


def ln_stat_diffs(x: np.ndarray, eps: float, device: str = "cpu"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(|d mean|, |d rstd|) in float64, shape (..., 1): the reference's layer_norm against
    torch's native_layer_norm on the same x (the statistics each backward reads)."""
    C = x.shape[-1]
    _, mean, rstd = layer_norm(x, np.ones(C, x.dtype), np.zeros(C, x.dtype), eps)
    _, t_mean, t_rstd = torch.native_layer_norm(torch.from_numpy(x).to(device), [C], None,
                                                None, eps)
    return tuple(np.abs(a.astype(np.float64) - t.cpu().numpy().astype(np.float64))
                 for a, t in ((mean, t_mean), (rstd, t_rstd)))  # type: ignore[return-value]


def row_order(device: str) -> bool:
    """Whether torch's LayerNorm backward adds dw's and db's rows in order (CPU, one thread; on
    more it adds per-thread chunks: NOTE [ LayerNorm row sums on torch's CPU ])."""
    return device == "cpu" and torch.get_num_threads() == 1


def _module_pairs(path: str, module: rnn.Module, captured: tuple, noise: np.ndarray | None,
                  grads: dict[str, np.ndarray], compared: set[str]) -> list[Pair]:
    """One reference module run on torch's inputs and incoming gradient: (claim, where,
    reference, torch, S) for its output, input gradients and parameter gradients."""
    ins, t_out, t_gins, g = captured
    where = f"{path} ({ins[0].dtype})"
    if isinstance(module, Embedding):
        module.zero_grad()
        y = module.forward(ins[0])
        module.backward(g)
        compared.add(path + ".weight")
        return [("gpt.embedding", f"{where} y", y, t_out, None),
                ("gpt.embedding", f"{where} dW", module.weight.grad, grads[path + ".weight"],
                 None)]
    if isinstance(module, LayerNorm):
        module.zero_grad()
        y = module.forward(ins[0])
        dx = module.backward(g)
        s_dx, s_dw, _ = gb.layer_norm_backward_scales(
            ins[0], module.weight.data, g, ln_stat_diffs(ins[0], module.eps), row_order("cpu"))
        compared.update({path + ".weight", path + ".bias"})
        return [("gpt.layer_norm.forward", f"{where} y", y, t_out,
                 gb.layer_norm_forward_scale(ins[0], module.weight.data, module.bias.data)),
                ("gpt.layer_norm.backward", f"{where} dx", dx, t_gins[0], s_dx),
                ("gpt.layer_norm.backward", f"{where} dw", module.weight.grad,
                 grads[path + ".weight"], s_dw),
                ("gpt.layer_norm.bias_grad", f"{where} db", module.bias.grad,
                 grads[path + ".bias"], None)]
    if isinstance(module, rattn.AttentionCore):
        y = module.forward(*ins)
        d_ins = module.backward(g)
        out = [("gpt.attention.forward", f"{where} y", y, t_out,
                gb.attention_forward_scale(*ins, noise)[0])]
        scales = gb.attention_backward_scales(*ins, noise, g)
        return out + [("gpt.attention.backward", f"{where} d{n}", d, td, s)
                      for n, d, td, s in zip("qkv", d_ins, t_gins, scales, strict=True)]
    if isinstance(module, rnn.Linear):
        y, dx, pgrads = run_ref_layer(module, ins[0], g)
        s = linear_scales(module, ins[0], g)
        compared.update(f"{path}.{key}" for key in pgrads)
        return [("nn.linear", f"{where} y", y, t_out, s["y"]),
                ("nn.linear", f"{where} dx", dx, t_gins[0], s["dx"])] + [
                ("nn.linear", f"{where} {key}", grad, grads[f"{path}.{key}"], s[key])
                for key, grad in pgrads.items()]
    y, dx, _ = run_ref_layer(module, ins[0], g)  # GELU
    ax, ag = np.abs(ins[0].astype(np.float64)), np.abs(g.astype(np.float64))
    return [("nn.gelu_tanh.forward", f"{where} y", y, t_out, ax),
            ("nn.gelu_tanh.backward", f"{where} dx", dx, t_gins[0],
             ag * (1 + ax * (1 + ax * ax)))]


def layerwise_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int
                    ) -> tuple[list[Pair], set[str], set[str]]:
    """Every captured op of an untied model fed torch's own inputs and incoming gradient:
    (pairs, parameter names compared, all parameter names). CPU."""
    ref, twin = make_pair(config, dtype, seed % 1000, affine=True)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, layerwise=True)
    modules = dict(ref.named_modules())
    pairs: list[Pair] = []
    compared: set[str] = set()
    for path, captured in run.layers.items():
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None
        if keep is not None:
            replay_masks(modules[path], {"attn_dropout": keep})
            noise = keep.astype(dtype) / dtype(1 - config.dropout)
        pairs += _module_pairs(path, modules[path], captured, noise, run.grads, compared)
    return pairs, compared, {name for name, _ in ref.named_parameters()}


def residual_pairs(config: GPTConfig, dtype: type, seen: dict, run: TorchRun,
                   claim_id: str = "gpt.logits", product: tuple[float, float] | None = None
                   ) -> list[Pair]:
    """gpt.logits for the glue between the ops: each LayerNorm's input (the residual stream)
    against the previous one plus the branch's c_proj output, carried, with the dropout
    product and the add rounding once each (the first: embeddings and their sum, exact).
    `product`: (eps, smallest subnormal) of the dropout product's dtype (an lp dtype under
    autocast; default: dtype's own, whose underflow is negligible here)."""
    eps = float(np.finfo(dtype).eps)
    rel, tiny = (product[0] / eps, product[1] / eps) if product else (1.0, 0.0)
    scale = 1.0 / (1.0 - config.dropout)

    def diff(path: str, which: int) -> tuple[np.ndarray, np.ndarray]:
        t = (run.layers[path][0][0] if which == 0 else run.layers[path][1]).astype(np.float64)
        r = (seen[path][0][0] if which == 0 else seen[path][1]).astype(np.float64)
        return t, np.abs(r - t) / eps

    def noise(path: str) -> np.ndarray | float:
        keep = run.keeps.get(path)
        return 1.0 if keep is None else keep * scale

    stream = [f"transformer.h.{i}.{ln}" for i in range(config.n_layer) for ln in ("ln_1", "ln_2")]
    stream.append("transformer.ln_f")
    x, e = diff(stream[0], 0)
    out = [(claim_id, stream[0] + " input", seen[stream[0]][0][0], run.layers[stream[0]][0][0],
            np.abs(x))]
    for prev, ln in itertools.pairwise(stream):
        block = prev.rsplit(".", 1)[0]
        branch = f"{block}.attn" if prev.endswith("ln_1") else f"{block}.mlp"
        drop = f"{branch}.resid_dropout" if prev.endswith("ln_1") else f"{branch}.dropout"
        y, e_y = diff(f"{branch}.c_proj", 1)
        n = noise(drop)
        x_new, _ = diff(ln, 0)
        s = e + np.abs(n) * e_y + rel * np.abs(n * y) + tiny * (np.abs(n) > 0) + np.abs(x_new)
        s *= 1 + 2.0**-40  # the scale's own float64 evaluation: e passes through exactly
        out.append((claim_id, ln + " input (residual)", seen[ln][0][0],
                    run.layers[ln][0][0], s))
        x, e = x_new, np.abs(seen[ln][0][0].astype(np.float64) - x_new) / eps
    return out


def carried_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int,
                  device: str = "cpu") -> list[Pair]:
    """gpt.logits for every op along one end-to-end forward, then gpt.loss."""
    ref, twin = make_pair(config, dtype, seed % 1000, device, affine=True)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, device=device, layerwise=True)
    seen, _ = record_ref(ref, idx, targets, run.keeps)
    modules = dict(ref.named_modules())
    gelu = float(claim("nn.gelu_tanh.forward").bound)  # type: ignore[arg-type]
    pairs: list[Pair] = []
    for path, (ins, out) in seen.items():
        t_ins, t_out = run.layers[path][0], run.layers[path][1]
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None if keep is None else keep.astype(dtype) / dtype(1 - config.dropout)
        pairs.append(("gpt.logits", path, out, t_out,
                      carried_scale(modules[path], ins, t_ins, noise, gelu)))
    pairs += residual_pairs(config, dtype, seen, run)
    logits, loss = run_ref(ref, idx, targets, run.keeps)[:2]
    V = config.vocab_size
    flat, t_flat = logits.reshape(-1, V), run.logits.reshape(-1, V)
    e = (flat.astype(np.float64) - t_flat.astype(np.float64)) / float(np.finfo(dtype).eps)
    s_loss = gb.loss_scale(t_flat, targets.reshape(-1), e, torch.device(device).type == "cpu")
    return [*pairs, ("gpt.loss", "loss", loss, run.loss, np.asarray(s_loss))]


def _param_grad_scales(module: rnn.Module, x: np.ndarray, e_x: np.ndarray, g: np.ndarray,
                       e_g: np.ndarray, device: str) -> dict[str, np.ndarray]:
    """gpt.grads: each parameter gradient's own budget at torch's x and g plus the measured
    differences e_x of the module's input and e_g of its incoming gradient (in eps)."""
    ag = np.abs(g.astype(np.float64))
    if isinstance(module, Embedding):
        flat = x.reshape(-1)
        counts = np.bincount(flat, minlength=module.num_embeddings)[:, None]
        scatter = np.zeros((module.num_embeddings, g.shape[-1]))
        np.add.at(scatter, flat, e_g.reshape(-1, g.shape[-1]))
        summed = np.zeros_like(scatter)
        np.add.at(summed, flat, ag.reshape(-1, g.shape[-1]))
        return {"weight": scatter + (counts + 1) * summed}
    rows = tuple(range(g.ndim - 1))
    n = int(np.prod(g.shape[:-1]))
    if isinstance(module, LayerNorm):
        _, s_dw, s_db = gb.layer_norm_backward_scales(
            x, module.weight.data, g, ln_stat_diffs(x, module.eps, device), row_order(device))
        xhat, rstd = gb.layer_norm_values(x)
        ax = np.abs(xhat)
        x_extra = rstd * (e_x + e_x.mean(-1, keepdims=True)) + ax * rstd * (
            ax * e_x).mean(-1, keepdims=True)
        return {"weight": s_dw + (e_g * ax + ag * x_extra).sum(axis=rows),
                "bias": e_g.sum(axis=rows) + s_db}
    x2 = np.abs(x.astype(np.float64)).reshape(n, -1)
    g2, eg2, ex2 = ag.reshape(n, -1), e_g.reshape(n, -1), e_x.reshape(n, -1)
    out = {"weight": eg2.T @ x2 + g2.T @ ex2 + (n + 1) * (g2.T @ x2)}
    if module.bias is not None:  # type: ignore[attr-defined]
        out["bias"] = eg2.sum(axis=0) + (n + 1) * g2.sum(axis=0)
    return out


def grad_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int,
               device: str = "cpu") -> tuple[list[Pair], set[str], set[str]]:
    """gpt.grads for every parameter of an untied model along one end-to-end forward and
    backward: (pairs, parameter names compared, all parameter names)."""
    ref, twin = make_pair(config, dtype, seed % 1000, device, affine=True)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, device=device, layerwise=True)
    seen, gouts = record_ref(ref, idx, targets, run.keeps, backward=True)
    eps = float(np.finfo(dtype).eps)
    pairs: list[Pair] = []
    compared: set[str] = set()
    for path, m in ref.named_modules():
        if path not in gouts:
            continue
        t_ins, _, _, t_g = run.layers[path]
        x = t_ins[0]
        e_x = (np.zeros(x.shape) if isinstance(m, Embedding) else
               np.abs(seen[path][0][0].astype(np.float64) - x.astype(np.float64)) / eps)
        e_g = np.abs(gouts[path].astype(np.float64) - t_g.astype(np.float64)) / eps
        for key, scale in _param_grad_scales(m, x, e_x, t_g, e_g, device).items():
            name = f"{path}.{key}"
            pairs.append(("gpt.grads", name, m._params[key].grad, run.grads[name], scale))
            compared.add(name)
    return pairs, compared, {name for name, _ in ref.named_parameters()}


def sdpa_carried_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int,
                       device: str = "cpu") -> list:
    """gpt.sdpa_logits along one end-to-end forward, dropout off: the reference (explicit
    attention, the only one it has) against torch's attention='sdpa' model on the same
    weights, every op up to the logits checked at torch's inputs as gpt.logits checks it
    (its own budget plus its inputs' measured differences carried), the cores with
    sdpa_core_scale, and the residual stream between them. Pairs (claim, where, ref, torch, S)."""
    if config.dropout:
        raise ValueError("sdpa_carried_pairs: sdpa draws its own dropout; compare with none")
    ref, _ = make_pair(dataclasses.replace(config, attention="explicit"), dtype, seed % 1000,
                       device, affine=True)
    twin = tgpt.GPT(dataclasses.replace(config, attention="sdpa"),
                    generator=torch.Generator().manual_seed(seed % 1000),
                    dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    twin.load_state_dict(state_dict_to_torch(ref.state_dict(), device))
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, device=device, layerwise=True)
    seen, _ = record_ref(ref, idx, targets, run.keeps)
    modules = dict(ref.named_modules())
    gelu = float(claim("nn.gelu_tanh.forward").bound)
    eps = float(np.finfo(dtype).eps)
    pairs = []
    for path, (ins, out) in seen.items():
        t_ins, t_out = run.layers[path][0], run.layers[path][1]
        if path.endswith(".core"):
            e = [np.abs(a.astype(np.float64) - b.astype(np.float64)) / eps
                 for a, b in zip(ins, t_ins, strict=True)]
            scale = sdpa_core_scale(*t_ins, t_out, *e)
        else:
            scale = carried_scale(modules[path], ins, t_ins, None, gelu)
        pairs.append(("gpt.sdpa_logits", path, out, t_out, scale))
    return pairs + residual_pairs(config, dtype, seen, run, claim_id="gpt.sdpa_logits")


# -- the saved tensors
