"""Quick checks of the nn claims for `python -m parity report` (drivers: parity/drivers/nn.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from parity.compare import max_abs_difference, measure
from parity.drivers.nn import (
    activation_claims,
    activation_scales,
    ce_scales,
    linear_scales,
    loss_pair,
    mlp_forward_with_bound,
    mse_scale,
    run_ref,
    run_torch,
    saved_signature,
    torch_activation_saved,
    torch_twin,
)
from parity.report import Observation, check
from parity.strategies.nn import absorbing_logits, absorbing_residuals
from parity.tolerances import claim
from reference import nn as ref
from torch_impl import nn as tnn

_RNG_SEED = 20240601


class _Worst:
    """The worst case of one claim over many compared pairs, with the raw max |a - b|."""

    def __init__(self, claim_id: str) -> None:
        self.claim, self.worst, self.n, self.raw = claim(claim_id), 0.0, 0, 0.0

    def add(self, a: Any, b: Any, scale: Any = None, n: int | None = None) -> None:
        observed = measure(self.claim, a, b, scale=scale)
        if self.claim.kind in ("bits", "nan_class"):
            self.worst += observed  # mismatches add up
        else:
            self.worst = max(self.worst, observed)
            self.raw = max(self.raw, max_abs_difference(a, b))
        self.n += np.size(a) if n is None else n

    def observation(self, note: str = "") -> Observation:
        raw = None if self.claim.kind in ("bits", "nan_class") else self.raw
        return Observation(self.worst, self.n, note, raw=raw)


def _layer_obs(make: Callable[[], ref.Module], which: int) -> Observation:
    rng = np.random.default_rng(_RNG_SEED)
    w = _Worst(activation_claims(make())[which])
    for dtype in (np.float32, np.float64):
        layer = make()
        x = (rng.standard_normal((64, 48)) * 3).astype(dtype)
        g = rng.standard_normal(x.shape).astype(dtype)
        y, dx, _ = run_ref(layer, x, g)
        ty, tdx, _, _ = run_torch(torch_twin(layer), x, g)
        s_fwd, s_bwd = activation_scales(layer, x, y, g)
        w.add(*((y, ty, s_fwd) if which == 0 else (dx, tdx, s_bwd)))
    return w.observation("float32 and float64, x ~ 3 N(0, 1), 64 x 48")


for _cid, _mk, _which in [
    ("nn.tanh.forward", ref.Tanh, 0), ("nn.tanh.backward", ref.Tanh, 1),
    ("nn.gelu_tanh.forward", lambda: ref.GELU("tanh"), 0),
    ("nn.gelu_tanh.backward", lambda: ref.GELU("tanh"), 1),
    ("nn.gelu.forward", ref.GELU, 0), ("nn.gelu.backward", ref.GELU, 1),
]:
    check(_cid)(lambda mk=_mk, which=_which: _layer_obs(mk, which))


@check("nn.relu")
def _() -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst("nn.relu")
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((64, 48)).astype(dtype)
        x[0, :5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
        g = rng.standard_normal(x.shape).astype(dtype)
        y, dx, _ = run_ref(ref.ReLU(), x, g)
        ty, tdx, _, _ = run_torch(torch.nn.ReLU(), x, g)
        w.add(y, ty)
        w.add(dx, tdx)
    return w.observation("including +-0, +-inf and NaN")


@check("nn.dropout")
def _() -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst("nn.dropout")
    with torch.random.fork_rng():
        torch.manual_seed(_RNG_SEED)
        for dtype in (np.float32, np.float64):
            for p in (0.1, 0.5, 0.9):
                x = rng.standard_normal((64, 48)).astype(dtype)
                g = rng.standard_normal(x.shape).astype(dtype)
                ty, tdx, _, keep = run_torch(torch.nn.Dropout(p), x, g)
                y, dx, _ = run_ref(ref.Dropout(p, rng=rng), x, g, keep)
                w.add(y, ty)
                w.add(dx, tdx)
    return w.observation("torch's mask fed to the reference")


@check("nn.linear")
def _() -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst("nn.linear")
    for dtype in (np.float32, np.float64):
        for n_in, n_out, batch in ((16, 64, 32), (256, 8, 64), (1000, 3, 7)):
            layer = ref.Linear(n_in, n_out, rng=rng, dtype=dtype)
            x = rng.standard_normal((batch, n_in)).astype(dtype)
            g = rng.standard_normal((batch, n_out)).astype(dtype)
            y, dx, grads = run_ref(layer, x, g)
            ty, tdx, tgrads, _ = run_torch(torch_twin(layer), x, g)
            s = linear_scales(layer, x, g)
            w.add(y, ty, s["y"])
            w.add(dx, tdx, s["dx"])
            for key in ("weight", "bias"):
                w.add(grads[key], tgrads[key], s[key])
    return w.observation("y, dx, dW, db; k up to 1000")


@check("nn.mse_loss.elementwise")
def _() -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst("nn.mse_loss.elementwise")
    for dtype in (np.float32, np.float64):
        for reduction in ("none", "sum", "mean"):
            x = (rng.standard_normal((64, 10)) * 5).astype(dtype)
            t = (rng.standard_normal((64, 10)) * 5).astype(dtype)
            loss, tloss, dx, tdx, _, _ = loss_pair("mse", x, t, rng, reduction)
            if reduction == "none":
                w.add(loss, tloss)
            w.add(dx, tdx)
    return w.observation()


def _reduced_obs(claim_id: str, kind: str, reductions: Sequence[str]) -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst(claim_id)
    for dtype in (np.float32, np.float64):
        for reduction in reductions:
            for (batch, classes), absorbing in [(s, False) for s in ((64, 10), (3, 100), (200, 7))
                                                ] + [(s, True) for s in ((4, 4), (8, 2), (1, 16))]:
                sub = np.random.default_rng(rng.integers(2**32))
                if absorbing:
                    make = absorbing_residuals if kind == "mse" else absorbing_logits
                    x = make(sub, (batch, classes), dtype)
                    t = np.zeros_like(x)
                else:  # logits with a large common offset in the smallest shape
                    offset = 100.0 if kind == "ce" and batch == 3 else 0.0
                    x = (sub.standard_normal((batch, classes)) * 5 + offset).astype(dtype)
                    t = (sub.standard_normal((batch, classes)) * 5).astype(dtype)
                loss, tloss, dx, tdx, g, target = loss_pair(kind, x, t, sub, reduction)
                if kind == "mse":
                    w.add(loss, tloss, mse_scale(reduction, x, t))
                else:
                    s_loss, s_grad = ce_scales(reduction, x, target, g, dx)
                    w.add(loss, tloss, s_loss)
                    w.add(dx, tdx, s_grad)
    return w.observation("normal inputs up to 1,400 elements and small absorbing ones")


check("nn.mse_loss.reduced")(lambda: _reduced_obs("nn.mse_loss.reduced", "mse", ("sum", "mean")))
check("nn.cross_entropy")(lambda: _reduced_obs("nn.cross_entropy", "ce", ("none", "sum", "mean")))


@check("nn.saved_tensors")
def _() -> Observation:
    rng, w = np.random.default_rng(_RNG_SEED), _Worst("nn.saved_tensors")
    with torch.random.fork_rng():
        torch.manual_seed(_RNG_SEED)
        for dtype in (np.float32, np.float64):
            layers = [ref.Linear(16, 8, rng=rng, dtype=dtype), ref.ReLU(), ref.Tanh(),
                      ref.GELU(), ref.GELU("tanh"), ref.Dropout(0.25, rng=rng)]
            for layer in layers:
                x = rng.standard_normal((5, 3, 16)).astype(dtype)
                layer.forward(x)
                w.add(saved_signature(layer.tape()), torch_activation_saved(torch_twin(layer), x),
                      n=1)
    return w.observation("layers in float32 and float64, input (5, 3, 16)")


@check("nn.state_dict_roundtrip")
def _() -> Observation:
    w = _Worst("nn.state_dict_roundtrip")
    for dtype in (np.float32, np.float64):
        model = ref.make_mlp((16, 64, 64, 4), rng=np.random.default_rng(_RNG_SEED), dtype=dtype)
        state = model.state_dict()
        back = tnn.state_dict_from_torch(tnn.state_dict_to_torch(state))
        for key in state:
            w.add(back[key], state[key])
    return w.observation("make_mlp((16, 64, 64, 4))")


@check("nn.mlp.forward")
def _() -> Observation:
    w = _Worst("nn.mlp.forward")
    # Narrow layers are where the first-order worst case is approached (the Linear bound
    # grows with k while the observed differences do not); the wide model is the usual one.
    for sizes in ((16, 64, 64, 4), (4, 3, 3, 2), (2, 2, 2, 2)):
        for dtype in (np.float32, np.float64):
            for act in ref.ACTIVATIONS:
                model = ref.make_mlp(sizes, act, rng=np.random.default_rng(1), dtype=dtype)
                twin = tnn.make_mlp(sizes, act, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64 if dtype == np.float64 else torch.float32)
                twin.load_state_dict(tnn.state_dict_to_torch(model.state_dict()))
                x = (np.random.default_rng(2).standard_normal((64, sizes[0])) * 2).astype(dtype)
                y, bound = mlp_forward_with_bound(model, x, {})
                w.add(y, twin(torch.from_numpy(x)).detach().numpy(), bound)
    return w.observation("batch 64; sizes 16-64-64-4, 4-3-3-2, 2-2-2-2; every activation")
