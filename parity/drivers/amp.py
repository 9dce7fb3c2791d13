"""Running one op (or the whole compact model) under autocast in both trees.

Every low-precision result a driver returns for an `ulps` claim is first checked to be a
member of its format on both sides (`require_members`): an ulp count rounds its inputs into
the format, so a MISSING rounding would otherwise read as 0 ulps. A driver refuses such a
result with a ValueError naming the tensor; it never judges a claim (parity/compare.py does).

On CUDA the matmuls must accumulate in float32, as the claims' derivations assume: cuBLAS may
otherwise reduce fp16/bf16 products in lower precision (split-K), so `float32_accumulation`
switches torch's reduced-precision reductions off around every CUDA run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy
from parity.drivers.lp_ordinal import rounding_spread
from reference import amp as ramp
from reference import nn as rnn
from reference.formats import decode, encode, get_format, quantize
from torch_impl import nn as tnn
from torch_impl import state_mapping as tstate
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

SUFFIX = {"bfloat16": "bf16", "float16": "fp16"}
U32 = 2.0**-24  # float32 unit roundoff

Pair = tuple[str, np.ndarray, np.ndarray, np.ndarray]  # (label, reference, torch, mask/bound)


# -- guards and units
def require_members(fmt: str, label: str, *arrays: np.ndarray) -> None:
    """ValueError unless every element of the (reference, torch) float32/float64 arrays is a
    value of `fmt`: encoding it into fmt and decoding it back gives the same bits."""
    for side, a in zip(("reference", "torch"), arrays, strict=False):
        a = np.ascontiguousarray(a)
        uint = {4: np.uint32, 8: np.uint64}[a.itemsize]
        with np.errstate(over="ignore"):
            back = decode(encode(a, fmt), fmt, dtype=np.float64).astype(a.dtype)
        bad = (back.view(uint) != a.view(uint)) & ~np.isnan(a)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{label} ({side}): {int(bad.sum())} of {a.size} elements are not "
                             f"{fmt} values (first: {a.reshape(-1)[i]!r}): a missing rounding")


def lp_ulp(y: np.ndarray, fmt: str) -> np.ndarray:
    """The spacing of `fmt` at |y| (the subnormal spacing below the normal range)."""
    f = get_format(fmt)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(np.asarray(y, dtype=np.float64))))
    e = np.maximum(np.where(np.isfinite(e), e, f.min_exponent), f.min_exponent)
    return np.ldexp(1.0, (e - f.mantissa_bits).astype(np.int64))


def gamma(k: int) -> float:
    """gamma_k = k u / (1 - k u), u = 2^-24: a float32 sum of k terms in any order is within
    gamma_k sum|terms| of the exact sum (Higham, Thm 3.5)."""
    return k * U32 / (1 - k * U32)


def reliable(a: np.ndarray, b: np.ndarray, result: np.ndarray, fmt: str) -> np.ndarray:
    """Where the float32 accumulation bound k 2^-24 sum|a_i b_i| of a @ b is below half an
    lp ulp of the result: the precondition of amp.linear_* (a: (n, k), b: (k, m))."""
    k = a.shape[1]
    bound = k * U32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    return bound < lp_ulp(result, fmt) / 2


@contextlib.contextmanager
def float32_accumulation(device: str) -> Iterator[None]:
    """On CUDA, forbid cuBLAS's reduced-precision reductions of fp16/bf16 matmuls for the
    duration (restored after); a no-op on CPU, whose lp matmuls accumulate in float32."""
    if torch.device(device).type != "cuda":
        yield
        return
    m = torch.backends.cuda.matmul
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


def f32(a: Any) -> np.ndarray:
    """Either side as a float32 NumPy array: a reference array or a torch tensor, an lp one
    widened exactly (bfloat16 by ml_dtypes, as_numpy)."""
    return as_numpy(a).astype(np.float32)


# -- one Linear
def linear_pairs(fmt: str, n: int, k: int, m: int, seed: int, device: str = "cpu"
                 ) -> list[Pair]:
    """(label, reference, torch, reliable mask) for y, dx, dW, db, saved input and weight,
    and the master weight; the lp results are checked to be members of fmt."""
    rng = np.random.default_rng(seed)
    layer = rnn.Linear(k, m, rng=rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    g = quantize(rng.standard_normal((n, m)).astype(np.float32), fmt)
    return linear_pairs_at(fmt, layer, x, g, device)


def linear_pairs_at(fmt: str, layer: rnn.Linear, x: np.ndarray, g: np.ndarray,
                    device: str = "cpu") -> list[Pair]:
    """linear_pairs for a given reference Linear (its weights copied into torch's), float32
    input x (n, k) and lp output gradient g (n, m)."""
    (n, k), m = x.shape, layer.weight.data.shape[0]
    w0 = layer.weight.data.copy()
    with ramp.autocast(fmt):
        y = f32(layer.forward(x))
    saved = {k: f32(v) for k, v in layer.saved_tensors().items()}
    dx = f32(layer.backward(ramp.cast(g, ramp.LP_DTYPES[fmt])))

    tl = torch.nn.Linear(k, m)
    tl.load_state_dict(tstate.state_dict_to_torch(layer.state_dict()))
    tl.to(device)
    tx = torch.from_numpy(x).to(device).requires_grad_()
    with float32_accumulation(device), torch.autocast(torch.device(device).type,
                                                      dtype=TORCH_DTYPES[fmt]):
        ty = tl(tx)
    t_saved = (f32(ty.grad_fn._saved_mat1), f32(ty.grad_fn._saved_mat2).T)
    with float32_accumulation(device):
        ty.backward(torch.from_numpy(g).to(device, TORCH_DTYPES[fmt]))

    x_lp, w_lp = saved["input"], saved["weight"].T  # mat2 is W_lp^T: (in, out)
    db, t_db = layer.bias.grad, tl.bias.grad  # type: ignore[union-attr]
    pairs: list[Pair] = [
        ("y", y, f32(ty), reliable(x_lp, w_lp.T, y, fmt)),
        ("dx", dx, f32(tx.grad), reliable(g, w_lp, dx, fmt)),
        ("dW", layer.weight.grad, f32(tl.weight.grad), reliable(g.T, x_lp, layer.weight.grad,
                                                                  fmt)),
        ("db", db, f32(t_db), reliable(np.ones((1, n), np.float32), g, db[None], fmt)[0]),
        ("saved input", x_lp, t_saved[0], np.ones_like(x_lp, dtype=bool)),
        ("saved weight", w_lp, t_saved[1], np.ones_like(w_lp, dtype=bool)),
        ("master weight", w0, f32(tl.weight), np.ones_like(w0, dtype=bool)),
    ]
    for label, a, b, _ in pairs:
        if label != "master weight":
            require_members(fmt, f"Linear {label}", a, b)
    return pairs


# -- one activation on lp tensors
ACTIVATIONS = {"gelu": (rnn.GELU, torch.nn.GELU), "tanh": (rnn.Tanh, torch.nn.Tanh),
               "relu": (rnn.ReLU, torch.nn.ReLU),
               "gelu_tanh": (lambda: rnn.GELU("tanh"), lambda: torch.nn.GELU("tanh"))}


def activation_pairs(name: str, fmt: str, n: int, seed: int, device: str = "cpu"
                     ) -> list[Pair]:
    """(label, reference, torch, reliable mask) for the forward output and input gradient on
    lp tensors. Reliable: the float32 bound c eps S of the matching nn claim (tanh: 2 eps |y|
    and 6 eps |g|; GELU: c eps |x| and c eps |g| (1 + |x| (1 + x^2)); ReLU: exact) is below
    half an lp ulp of the result."""
    rng = np.random.default_rng(seed)
    x = quantize((rng.standard_normal(n) * 2).astype(np.float32), fmt)
    g = quantize(rng.standard_normal(n).astype(np.float32), fmt)
    return activation_pairs_at(name, fmt, x, g, device)


def activation_pairs_at(name: str, fmt: str, x: np.ndarray, g: np.ndarray,
                        device: str = "cpu") -> list[Pair]:
    """activation_pairs at given lp inputs x and output gradients g (float32 arrays holding
    fmt's values, shape (n,))."""
    n = x.size
    ref_layer, torch_layer = (f() for f in ACTIVATIONS[name])
    lp = ramp.LP_DTYPES[fmt]
    with ramp.autocast(fmt):
        y = f32(ref_layer.forward(ramp.cast(x, lp)))
    dx = f32(ref_layer.backward(ramp.cast(g, lp)))
    tx = torch.from_numpy(x).to(device, TORCH_DTYPES[fmt]).requires_grad_()
    with torch.autocast(torch.device(device).type, dtype=TORCH_DTYPES[fmt]):
        ty = torch_layer(tx)
    ty.backward(torch.from_numpy(g).to(device, TORCH_DTYPES[fmt]))
    ax, ag = np.abs(x.astype(np.float64)), np.abs(g.astype(np.float64))
    if name == "relu":
        bound_y = bound_dx = np.zeros(n)
    else:
        c_fwd, c_bwd = _activation_constants(torch_layer)
        eps32 = 2.0**-23
        if name == "tanh":
            bound_y, bound_dx = c_fwd * eps32 * np.abs(y), c_bwd * eps32 * ag
        else:
            bound_y = c_fwd * eps32 * ax
            bound_dx = c_bwd * eps32 * ag * (1 + ax * (1 + ax * ax))
    pairs: list[Pair] = [("y", y, f32(ty), bound_y < lp_ulp(y, fmt) / 2),
                         ("dx", dx, f32(tx.grad), bound_dx < lp_ulp(dx, fmt) / 2)]
    for label, a, b, _ in pairs:
        require_members(fmt, f"{name} {label}", a, b)
    return pairs


# -- Dropout on lp tensors
def dropout_pairs(fmt: str, p: float, n: int, seed: int) -> list[Pair]:
    """(label, reference, torch, all-true mask) for Dropout's output, saved mask and input
    gradient on an lp tensor under CPU autocast; the reference uses torch's keep-mask (read
    from what torch saved), so only the arithmetic is compared. CPU kernels only: CUDA fuses
    dropout (a bool mask, the scale applied in float32)."""
    from parity.drivers.nn import dropout_keep

    rng = np.random.default_rng(seed)
    lp = ramp.LP_DTYPES[fmt]
    x, g = (ramp.cast(rng.standard_normal(n).astype(np.float32), lp) for _ in range(2))
    tx = torch.from_numpy(f32(x)).to(TORCH_DTYPES[fmt]).requires_grad_()
    with torch.autocast("cpu", dtype=TORCH_DTYPES[fmt]):
        ty = torch.nn.functional.dropout(tx, p, training=True)
    t_mask, keep = f32(ty.grad_fn._saved_other), dropout_keep(ty)
    ty.backward(torch.from_numpy(f32(g)).to(TORCH_DTYPES[fmt]))
    layer = rnn.Dropout(p, rng=rng)
    with ramp.autocast(fmt):
        y = layer.forward(x, mask=keep)
    mask = f32(layer.saved_tensors()["mask"])
    dx = f32(layer.backward(g))
    pairs: list[Pair] = [("y", f32(y), f32(ty), np.ones(n, bool)),
                         ("saved mask", mask, t_mask, np.ones(n, bool)),
                         ("dx", dx, f32(tx.grad), np.ones(n, bool))]
    for label, a, b, _ in pairs:
        require_members(fmt, f"Dropout {label}", a, b)
    return pairs


# -- the compact model
def torch_autocast_run(tm: torch.nn.Sequential, x: np.ndarray, y: np.ndarray, fmt: str,
                       scale: float = 1.0, device: str = "cpu") -> list[torch.Tensor]:
    """torch's autocast forward layer by layer, MSE loss, backward of scale * loss: every
    activation (x, then each module's output) with its gradient retained."""
    acts = [torch.from_numpy(x).to(device)]
    with float32_accumulation(device):
        with torch.autocast(torch.device(device).type, dtype=TORCH_DTYPES[fmt]):
            for module in tm:
                acts.append(module(acts[-1]))
                acts[-1].retain_grad()
            loss = torch.nn.functional.mse_loss(acts[-1], torch.from_numpy(y).to(device))
        (loss * torch.tensor(scale, dtype=torch.float32, device=device)).backward()
    return acts


def _activation_constants(module: torch.nn.Module) -> tuple[float, float]:
    """(forward c, backward c) of the module's nn claims: each tree's float32 result within
    c eps S of the exact one (S as the claim states it)."""
    from parity.tolerances import claim

    stem = ("nn.tanh" if isinstance(module, torch.nn.Tanh) else
            "nn.gelu_tanh" if module.approximate == "tanh" else "nn.gelu")
    fwd, bwd = (claim(f"{stem}.{d}").bound for d in ("forward", "backward"))
    return float(fwd), float(bwd)  # type: ignore[arg-type]  (eps claims: the bound is c)


# -- the compact model, layer by layer on the reference's own run
def _gamma2(k: int) -> float:
    """Each float32 side within gamma_k of the exact sum, the float64 reference value
    within k 2^-53 of it: the half-width of the interval both results round from."""
    return gamma(k) + k * 2.0**-53 / (1 - k * 2.0**-53)


def _exact_activation(module: torch.nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f(x), f'(x)) in float64 from the definitions (NOTE [ GELU formulas ])."""
    if isinstance(module, torch.nn.Tanh):
        t = np.tanh(x)
        return t, 1 - t * t
    if module.approximate == "tanh":
        beta, kappa = np.sqrt(2 / np.pi), 0.044715
        t = np.tanh(beta * (x + kappa * x**3))
        return (0.5 * x * (1 + t),
                0.5 * (1 + t) + 0.5 * x * (1 - t * t) * beta * (1 + 3 * kappa * x * x))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    cdf = 0.5 * (1 + erf(x / np.sqrt(2)))
    return x * cdf, cdf + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)


def layerwise_pairs(ref: rnn.Sequential, tm: torch.nn.Sequential, x: np.ndarray,
                    y: np.ndarray, fmt: str, scale: float = 1.0, device: str = "cpu"
                    ) -> list[Pair]:
    """Run the reference model under autocast (loss MSE, backward of scale * loss); then give
    each torch layer, under torch.autocast, the input and the incoming gradient the
    reference's run gave the same layer. Returns (label, reference, torch, k): k per
    element is the `rounding_spread` of the exact result (from the same lp operands) with
    the float32 bound of the op; every lp result is checked to be a member of fmt."""
    outputs, output_grads, loss_fn = [], [np.empty(0)] * len(ref), rnn.MSELoss()
    with ramp.autocast(fmt):
        h = x
        for layer in ref:  # each layer's output, kept for the torch side
            h = layer.forward(h)
            outputs.append(f32(h))
        loss_fn(h, y)
    g = loss_fn.backward(np.float32(scale))  # lp: the cast's backward rounded it
    for i in range(len(ref) - 1, -1, -1):  # each layer's incoming gradient
        output_grads[i] = f32(g)
        g = ref[i].backward(g)
    out = outputs[-1]
    dt, dev = TORCH_DTYPES[fmt], torch.device(device)
    eps32 = 2.0**-23

    def lp(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev, dt)

    # the loss gradient at the output: both round the same float32 gradient (bits)
    t_out = lp(out).requires_grad_()
    with torch.autocast(dev.type, dtype=dt):
        loss = torch.nn.functional.mse_loss(t_out, torch.from_numpy(y).to(dev))
    (loss * torch.tensor(scale, dtype=torch.float32, device=dev)).backward()
    g_last = output_grads[-1]
    pairs: list[Pair] = [("loss gradient", g_last, f32(t_out.grad), np.zeros(g_last.shape,
                                                                              np.int64))]
    for i, (layer, module) in enumerate(zip(ref, tm, strict=True)):
        first = i == 0
        x_in = x if first else outputs[i - 1]
        g = output_grads[i]
        require_members(fmt, f"layer {i} incoming gradient", g)
        tx = (torch.from_numpy(x_in).to(dev) if first else lp(x_in)).requires_grad_(not first)
        with float32_accumulation(device), torch.autocast(dev.type, dtype=dt):
            ty = module(tx)
        with float32_accumulation(device):
            ty.backward(lp(g))
        x64 = (quantize(x_in, fmt) if first else x_in).astype(np.float64)
        g64 = g.astype(np.float64)
        if isinstance(layer, rnn.Linear):
            w = quantize(layer.weight.data, fmt).astype(np.float64)
            b = quantize(layer.bias.data, fmt).astype(np.float64)  # type: ignore[union-attr]
            ax, aw, ag = np.abs(x64), np.abs(w), np.abs(g64)
            k_in, k_out, nb = layer.in_features, layer.out_features, x64.shape[0]
            k_y = rounding_spread(x64 @ w.T + b, _gamma2(k_in + 1) * (ax @ aw.T + np.abs(b)),
                                  fmt)
            k_dx = rounding_spread(g64 @ w, _gamma2(k_out) * (ag @ aw), fmt)
            k_dw = rounding_spread(g64.T @ x64, _gamma2(nb) * (ag.T @ ax), fmt)
            k_db = rounding_spread(g64.sum(0), _gamma2(nb) * ag.sum(0), fmt)
            pairs += [(f"{i}.weight grad", layer.weight.grad, f32(module.weight.grad), k_dw),
                      (f"{i}.bias grad", layer.bias.grad, f32(module.bias.grad), k_db)]
        elif isinstance(layer, rnn.ReLU):
            k_y = k_dx = np.zeros(x64.shape, np.int64)  # exact on lp values
        else:
            c_fwd, c_bwd = _activation_constants(module)
            f, df = _exact_activation(module, x64)
            ax, ag = np.abs(x64), np.abs(g64)
            if isinstance(layer, rnn.Tanh):  # backward reads the saved lp output
                y_r, y_t = outputs[i].astype(np.float64), f32(ty).astype(np.float64)
                dy = np.abs(y_r - y_t)
                k_y = rounding_spread(f, c_fwd * eps32 * np.abs(f), fmt)
                k_dx = rounding_spread(g64 * (1 - y_r * y_r), c_bwd * eps32 * ag
                                       + 2 * ag * (np.abs(y_r) + dy) * dy, fmt)
            else:
                k_y = rounding_spread(f, c_fwd * eps32 * ax, fmt)
                k_dx = rounding_spread(g64 * df, c_bwd * eps32 * ag * (1 + ax * (1 + ax * ax)),
                                       fmt)
        pairs.append((f"layer {i} output", outputs[i], f32(ty), k_y))
        if not first:
            pairs.append((f"layer {i} input gradient", output_grads[i - 1],
                          f32(tx.grad), k_dx))
    for label, a, b, _ in pairs:
        require_members(fmt, f"model {label}", a, b)
    return pairs


def model_pairs(activation: str, fmt: str, seed: int, device: str = "cpu",
                sizes: tuple[int, ...] = (16, 64, 64, 4), batch: int = 32) -> list[Pair]:
    """layerwise_pairs for the compact model make_mlp(sizes, activation), seeded."""
    ref = rnn.make_mlp(sizes, activation, rng=np.random.default_rng(seed))
    tm = tnn.make_mlp(sizes, activation, generator=torch.Generator().manual_seed(seed))
    tm.load_state_dict(tstate.state_dict_to_torch(ref.state_dict()))
    tm.to(device)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    return layerwise_pairs(ref, tm, x, y, fmt, device=device)

