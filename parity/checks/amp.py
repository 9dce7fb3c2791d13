"""Quick checks of the amp claims for `python -m parity report`, and the drivers that
parity/test_amp.py shares: one op (or the whole compact model) under autocast, both sides."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity.compare import measure
from parity.report import Observation, check
from parity.tolerances import claim
from reference import amp as ramp
from reference import nn as rnn
from reference.formats import get_format, quantize
from torch_impl import nn as tnn

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
SUFFIX = {"bfloat16": "bf16", "float16": "fp16"}


def lp_ulp(y: np.ndarray, fmt: str) -> np.ndarray:
    """The spacing of `fmt` at |y| (the subnormal spacing below the normal range)."""
    f = get_format(fmt)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(y.astype(np.float64))))
    e = np.maximum(np.where(np.isfinite(e), e, f.min_exponent), f.min_exponent)
    return np.ldexp(1.0, (e - f.mantissa_bits).astype(np.int64))


def reliable(a: np.ndarray, b: np.ndarray, result: np.ndarray, fmt: str) -> np.ndarray:
    """Where the float32 accumulation bound k 2^-24 sum|a_i b_i| of a @ b is below half an
    lp ulp of the result: the precondition of amp.linear_* (a: (n, k), b: (k, m))."""
    k = a.shape[1]
    bound = k * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    return bound < lp_ulp(result, fmt) / 2


def linear_pairs(fmt: str, n: int, k: int, m: int, seed: int
                 ) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(label, reference, torch, reliable mask) for y, dx, dW, db, saved input and weight."""
    rng = np.random.default_rng(seed)
    layer = rnn.Linear(k, m, rng=rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    g = quantize(rng.standard_normal((n, m)).astype(np.float32), fmt)
    w0 = layer.weight.data.copy()
    y = ramp.linear_forward(layer, x, fmt)
    saved = layer.saved_tensors()
    dx = ramp.linear_backward(layer, g, fmt)

    tl = torch.nn.Linear(k, m)
    tl.load_state_dict(tnn.state_dict_to_torch(layer.state_dict()))
    tx = torch.from_numpy(x).requires_grad_()
    with torch.autocast("cpu", dtype=TORCH_DTYPES[fmt]):
        ty = tl(tx)
    t_saved = (ty.grad_fn._saved_mat1.detach().float().numpy(),
               ty.grad_fn._saved_mat2.detach().float().numpy().T)
    ty.backward(torch.from_numpy(g).to(TORCH_DTYPES[fmt]))

    x_lp, w_lp = saved["input"], saved["weight"]
    every = np.ones((n, k), dtype=bool)
    return [
        ("y", y, ty.detach().float().numpy(), reliable(x_lp, w_lp.T, y, fmt)),
        ("dx", dx, tx.grad.numpy(), reliable(g, w_lp, dx, fmt)),
        ("dW", layer.weight.grad, tl.weight.grad.numpy(),
         reliable(g.T, x_lp, layer.weight.grad, fmt)),
        ("db", layer.bias.grad, tl.bias.grad.numpy(),  # type: ignore[union-attr]
         reliable(np.ones((1, n), np.float32), g, layer.bias.grad[None], fmt)[0]),  # type: ignore[union-attr,index]
        ("saved input", x_lp, t_saved[0], every),
        ("saved weight", w_lp, t_saved[1], np.ones_like(w_lp, dtype=bool)),
        ("master weight", w0, tl.weight.detach().numpy(), np.ones_like(w0, dtype=bool)),
    ]


ACTIVATIONS = {"gelu": (rnn.GELU, torch.nn.GELU), "tanh": (rnn.Tanh, torch.nn.Tanh),
               "relu": (rnn.ReLU, torch.nn.ReLU),
               "gelu_tanh": (lambda: rnn.GELU("tanh"), lambda: torch.nn.GELU("tanh"))}


def activation_pairs(name: str, fmt: str, n: int, seed: int
                     ) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(label, reference, torch, reliable mask) for the forward output and input gradient on
    lp tensors. Reliable: the float32 bound of the nn claims (8 eps |x| forward, 8 eps
    |g| (1 + |x| (1 + x^2)) backward, eps = 2^-23; 0 for the exact ReLU) is below half an
    lp ulp of the result."""
    rng = np.random.default_rng(seed)
    x = quantize((rng.standard_normal(n) * 2).astype(np.float32), fmt)
    g = quantize(rng.standard_normal(n).astype(np.float32), fmt)
    ref_layer, torch_layer = (f() for f in ACTIVATIONS[name])
    y = ramp.elementwise_forward(ref_layer, x, fmt)
    dx = ramp.elementwise_backward(ref_layer, g, fmt)
    tx = torch.from_numpy(x).to(TORCH_DTYPES[fmt]).requires_grad_()
    with torch.autocast("cpu", dtype=TORCH_DTYPES[fmt]):
        ty = torch_layer(tx)
    ty.backward(torch.from_numpy(g).to(TORCH_DTYPES[fmt]))
    eps = 0.0 if name == "relu" else 2.0**-23  # ReLU is exact (nn.relu)
    ax = np.abs(x.astype(np.float64))
    bound_y, bound_dx = 8 * eps * ax, 8 * eps * np.abs(g) * (1 + ax * (1 + ax * ax))
    return [("y", y, ty.detach().float().numpy(), bound_y < lp_ulp(y, fmt) / 2),
            ("dx", dx, tx.grad.float().numpy(), bound_dx < lp_ulp(dx, fmt) / 2)]


def model_pairs(activation: str, fmt: str, seed: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, reference / s, torch / s), s = max|torch|: the output and every parameter grad."""
    sizes = (16, 64, 64, 4)
    ref = rnn.make_mlp(sizes, activation, rng=np.random.default_rng(seed))
    tm = tnn.make_mlp(sizes, activation, generator=torch.Generator().manual_seed(seed))
    tm.load_state_dict(tnn.state_dict_to_torch(ref.state_dict()))
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 4)).astype(np.float32)
    amp_model, loss_fn = ramp.Autocast(ref, fmt), rnn.MSELoss()
    out = amp_model(x)
    loss_fn(out, y)
    amp_model.backward(loss_fn.backward())
    with torch.autocast("cpu", dtype=TORCH_DTYPES[fmt]):
        t_out = tm(torch.from_numpy(x))
        loss = torch.nn.functional.mse_loss(t_out, torch.from_numpy(y))
    loss.backward()
    pairs: list[tuple[str, Any, Any]] = [("output", out, t_out.detach().float().numpy())]
    pairs += [(name, p.grad, tp.grad.numpy())
              for (name, p), tp in zip(ref.named_parameters(), tm.parameters(), strict=True)]
    out_pairs = []
    for label, a, b in pairs:
        s = np.float64(np.max(np.abs(b))) or 1.0
        out_pairs.append((label, a.astype(np.float64) / s, b.astype(np.float64) / s))
    return out_pairs


@check("amp.casts")
def _() -> Observation:
    c, worst, n = claim("amp.casts"), 0.0, 0
    for fmt in TORCH_DTYPES:
        for label, a, b, _ in linear_pairs(fmt, 16, 32, 8, seed=0):
            if label.startswith(("saved", "master")):
                worst, n = max(worst, measure(c, a, b)), n + a.size
    return Observation(worst, n, "Linear(32, 8), batch 16")


def _linear_check(fmt: str) -> Observation:
    c, worst, n, excluded = claim(f"amp.linear_{SUFFIX[fmt]}"), 0.0, 0, 0
    for seed in range(3):
        for label, a, b, ok in linear_pairs(fmt, 32, 64, 16, seed):
            if label in ("y", "dx", "dW", "db"):
                worst = max(worst, measure(c, a[ok], b[ok]))
                n, excluded = n + int(ok.sum()), excluded + int((~ok).sum())
    return Observation(worst, n, f"{excluded} elements outside the precondition")


def _activation_check(fmt: str) -> Observation:
    c, worst, n, excluded = claim(f"amp.activation_{SUFFIX[fmt]}"), 0.0, 0, 0
    for name in ACTIVATIONS:
        for _label, a, b, ok in activation_pairs(name, fmt, 4096, seed=0):
            worst = max(worst, measure(c, a[ok], b[ok]))
            n, excluded = n + int(ok.sum()), excluded + int((~ok).sum())
    return Observation(worst, n, f"4 activations x 4096 lp inputs; {excluded} outside the "
                                 "precondition (GELU's tail, where |y| << |x|)")


for _fmt in TORCH_DTYPES:
    check(f"amp.linear_{SUFFIX[_fmt]}")(lambda fmt=_fmt: _linear_check(fmt))
    check(f"amp.activation_{SUFFIX[_fmt]}")(lambda fmt=_fmt: _activation_check(fmt))


@check("amp.model")
def _() -> Observation:
    c, worst, n = claim("amp.model"), 0.0, 0
    for fmt in TORCH_DTYPES:
        for activation in ("gelu", "tanh"):
            for _label, a, b in model_pairs(activation, fmt, seed=0):
                worst, n = max(worst, measure(c, a, b)), n + a.size
    return Observation(worst, n, "depth 3, width 64, gelu and tanh, bf16 and fp16")
