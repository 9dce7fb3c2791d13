"""Quick checks of the nn claims, and the helpers parity/test_nn.py shares with them.

Most nn claims bound |a - b| elementwise by c * eps * S, with S an array (|x|, |g|,
k * |A||B|, ...). `in_eps_units` turns that into a `close` claim with bound (0, c):
it returns |a - b| / (eps * S), compared against zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from parity.compare import in_eps_units, measure
from parity.drivers.nn import (  # noqa: F401
    LIPSCHITZ,
    _np,
    linear_scales,
    run_ref,
    run_torch,
    torch_layerwise,
    torch_twin,
    zeros_like,
)
from parity.report import Observation, check
from parity.tolerances import claim
from reference import nn as ref
from torch_impl import nn as tnn


def activation_scales(layer: ref.Module, x: np.ndarray, y: np.ndarray, g: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(S_forward, S_backward) of the activation claims (see parity/tolerances.py)."""
    ax, ag = np.abs(x.astype(np.float64)), np.abs(g.astype(np.float64))
    if isinstance(layer, ref.Tanh):
        return np.abs(y.astype(np.float64)), ag
    return ax, ag * (1.0 + ax * (1.0 + ax * ax))


def activation_claims(layer: ref.Module) -> tuple[str, str]:
    if isinstance(layer, ref.Tanh):
        return "nn.tanh.forward", "nn.tanh.backward"
    if isinstance(layer, ref.GELU):
        stem = "nn.gelu_tanh" if layer.approximate == "tanh" else "nn.gelu"
        return f"{stem}.forward", f"{stem}.backward"
    raise TypeError(f"no eps-scaled claim for {layer!r}")


# -- saved tensors
def saved_signature(entries: Sequence[object]) -> np.ndarray:
    """One int64 row per saved tensor: ndim, shape (padded to 4), dtype kind, itemsize, bytes."""
    rows = []
    for e in entries:
        dtype = np.dtype(e.dtype)  # type: ignore[attr-defined]
        shape = tuple(e.shape)  # type: ignore[attr-defined]
        rows.append([len(shape), *shape, *([-1] * (4 - len(shape))), ord(dtype.kind),
                     dtype.itemsize, e.nbytes])  # type: ignore[attr-defined]
    return np.array(sorted(rows), dtype=np.int64).reshape(-1, 8)


def torch_activation_saved(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """The signature of what torch saves, parameters excluded (the reference reads those)."""
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    entries = [s for s in tnn.measure_saved_tensors(module, tx) if not s.is_parameter]
    return saved_signature(entries)


# -- the whole model
def mlp_forward_with_bound(model: ref.Sequential, x: np.ndarray,
                           masks: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The reference output and the first-order bound on |y_ref - y_torch| (nn.mlp.forward).

    Each layer adds its own claimed error and amplifies the incoming one: |W| e for Linear,
    L e for an activation, |mask| e for Dropout (plus one rounding of its product).
    """
    eps = float(np.finfo(x.dtype).eps)
    e = np.zeros(x.shape)
    for i, layer in enumerate(model):
        y = layer.forward(x, mask=masks.get(i)) if isinstance(layer, ref.Dropout) \
            else layer.forward(x)
        ax, ay = np.abs(x.astype(np.float64)), np.abs(y.astype(np.float64))
        if isinstance(layer, ref.Linear):
            w = np.abs(layer.weight.data.astype(np.float64))
            b = 0.0 if layer.bias is None else np.abs(layer.bias.data.astype(np.float64))
            e = e @ w.T + eps * (layer.in_features + 1) * (ax @ w.T + b)
        elif isinstance(layer, ref.Dropout):
            m = np.abs(layer.saved_tensors().get("mask", np.ones((), x.dtype)).astype(float))
            e = m * e + eps * ay
        elif isinstance(layer, ref.ReLU):
            e = e.copy()
        else:
            c = float(claim(activation_claims(layer)[0]).bound[1])  # type: ignore[index]
            scale = activation_scales(layer, x, y, np.zeros_like(x))[0]
            e = LIPSCHITZ[type(layer).__name__] * e + c * eps * scale
        x = y
    model.free_saved()
    return x, e


# ------------------------------------------------------------------ report checks
_RNG_SEED = 20240601


def _layer_obs(layers: Sequence[ref.Module], which: int) -> Observation:
    rng = np.random.default_rng(_RNG_SEED)
    worst, n = 0.0, 0
    for dtype in (np.float32, np.float64):
        for layer in layers:
            x = (rng.standard_normal((64, 48)) * 3).astype(dtype)
            g = rng.standard_normal(x.shape).astype(dtype)
            y, dx, _ = run_ref(layer, x, g)
            ty, tdx, _, _ = run_torch(torch_twin(layer), x, g)
            c = claim(activation_claims(layer)[which])
            s_fwd, s_bwd = activation_scales(layer, x, y, g)
            a, b, s = (y, ty, s_fwd) if which == 0 else (dx, tdx, s_bwd)
            units = in_eps_units(a, b, s)
            worst, n = max(worst, measure(c, units, zeros_like(units))), n + units.size
    return Observation(worst, n, "float32 and float64, x ~ 3 N(0, 1), 64 x 48")


for _cid, _mk, _which in [
    ("nn.tanh.forward", ref.Tanh, 0), ("nn.tanh.backward", ref.Tanh, 1),
    ("nn.gelu_tanh.forward", lambda: ref.GELU("tanh"), 0),
    ("nn.gelu_tanh.backward", lambda: ref.GELU("tanh"), 1),
    ("nn.gelu.forward", ref.GELU, 0), ("nn.gelu.backward", ref.GELU, 1),
]:
    check(_cid)(lambda mk=_mk, which=_which: _layer_obs([mk()], which))


@check("nn.relu")
def _() -> Observation:
    rng, c, bad, n = np.random.default_rng(_RNG_SEED), claim("nn.relu"), 0.0, 0
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((64, 48)).astype(dtype)
        x[0, :5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
        g = rng.standard_normal(x.shape).astype(dtype)
        y, dx, _ = run_ref(ref.ReLU(), x, g)
        ty, tdx, _, _ = run_torch(torch.nn.ReLU(), x, g)
        bad += measure(c, y, ty) + measure(c, dx, tdx)
        n += 2 * x.size
    return Observation(bad, n, "including +-0, +-inf and NaN")


@check("nn.dropout")
def _() -> Observation:
    rng, c, bad, n = np.random.default_rng(_RNG_SEED), claim("nn.dropout"), 0.0, 0
    with torch.random.fork_rng():
        torch.manual_seed(_RNG_SEED)
        for dtype in (np.float32, np.float64):
            for p in (0.1, 0.5, 0.9):
                x = rng.standard_normal((64, 48)).astype(dtype)
                g = rng.standard_normal(x.shape).astype(dtype)
                ty, tdx, _, keep = run_torch(torch.nn.Dropout(p), x, g)
                y, dx, _ = run_ref(ref.Dropout(p, rng=rng), x, g, keep)
                bad += measure(c, y, ty) + measure(c, dx, tdx)
                n += 2 * x.size
    return Observation(bad, n, "torch's mask fed to the reference")


@check("nn.linear")
def _() -> Observation:
    rng, c, worst, n = np.random.default_rng(_RNG_SEED), claim("nn.linear"), 0.0, 0
    for dtype in (np.float32, np.float64):
        for n_in, n_out, batch in ((16, 64, 32), (256, 8, 64), (1000, 3, 7)):
            layer = ref.Linear(n_in, n_out, rng=rng, dtype=dtype)
            x = rng.standard_normal((batch, n_in)).astype(dtype)
            g = rng.standard_normal((batch, n_out)).astype(dtype)
            y, dx, grads = run_ref(layer, x, g)
            ty, tdx, tgrads, _ = run_torch(torch_twin(layer), x, g)
            s = linear_scales(layer, x, g)
            for a, b, key in ((y, ty, "y"), (dx, tdx, "dx"), (grads["weight"], tgrads["weight"],
                              "weight"), (grads["bias"], tgrads["bias"], "bias")):
                units = in_eps_units(a, b, s[key])
                worst, n = max(worst, measure(c, units, zeros_like(units))), n + units.size
    return Observation(worst, n, "y, dx, dW, db; k up to 1000")


def loss_scales(kind: str, reduction: str, x: np.ndarray, target: np.ndarray,
                g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S_loss, S_grad) of nn.mse_loss.reduced / nn.cross_entropy."""
    xf = x.astype(np.float64)
    if kind == "mse":
        d2 = (xf - target.astype(np.float64)) ** 2
        s = (d2.size + 1) * d2.sum()
        return np.asarray(s / d2.size if reduction == "mean" else s), np.ones(x.shape)
    batch, classes = (1, x.shape[0]) if x.ndim == 1 else x.shape
    k = (classes + batch + 2) * (1.0 + 2.0 * np.max(np.abs(xf), initial=0.0))
    s_loss = k * (batch if reduction == "sum" else 1)
    s_grad = k * np.max(np.abs(g.astype(np.float64)), initial=0.0)
    return np.asarray(s_loss), np.asarray(s_grad / batch if reduction == "mean" else s_grad)


@check("nn.mse_loss.elementwise")
def _() -> Observation:
    rng, c, bad, n = np.random.default_rng(_RNG_SEED), claim("nn.mse_loss.elementwise"), 0., 0
    for dtype in (np.float32, np.float64):
        for reduction in ("none", "sum", "mean"):
            x = (rng.standard_normal((64, 10)) * 5).astype(dtype)
            t = (rng.standard_normal((64, 10)) * 5).astype(dtype)
            loss, tloss, dx, tdx, _ = loss_pair("mse", x, t, rng, reduction)
            if reduction == "none":
                bad, n = bad + measure(c, loss, tloss), n + loss.size
            bad, n = bad + measure(c, dx, tdx), n + dx.size
    return Observation(bad, n, "")


def _reduced_obs(cid: str, kind: str, reductions: Sequence[str]) -> Observation:
    rng, c, worst, n = np.random.default_rng(_RNG_SEED), claim(cid), 0.0, 0
    for dtype in (np.float32, np.float64):
        for reduction in reductions:
            for batch, classes in ((64, 10), (3, 100), (200, 7)):
                sub = np.random.default_rng(rng.integers(2**32))
                x = (sub.standard_normal((batch, classes)) * 5).astype(dtype)
                t = (sub.standard_normal((batch, classes)) * 5).astype(dtype)
                loss, tloss, dx, tdx, g = loss_pair(kind, x, t, sub, reduction)
                s_loss, s_grad = loss_scales(kind, reduction, x, t, g)
                pairs = [(loss, tloss, s_loss)] + ([(dx, tdx, s_grad)] if kind == "ce" else [])
                for a, b, s in pairs:
                    units = in_eps_units(a, b, s)
                    worst, n = max(worst, measure(c, units, zeros_like(units))), n + units.size
    return Observation(worst, n, "")


def loss_pair(kind: str, x: np.ndarray, t: np.ndarray, rng: np.random.Generator, reduction: str
          ) -> tuple[np.ndarray, ...]:
    """(loss, torch loss, dx, torch dx, g) for one loss on given inputs."""
    if kind == "mse":
        r, tm, target = ref.MSELoss(reduction), torch.nn.MSELoss(reduction=reduction), t
    else:
        target = rng.integers(0, x.shape[-1], x.shape[:-1])
        r, tm = ref.CrossEntropyLoss(reduction), torch.nn.CrossEntropyLoss(reduction=reduction)
    loss = np.asarray(r(x, target))
    g = np.full(loss.shape, 0.75, dtype=x.dtype)
    dx = r.backward(g)
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    tl = tm(tx, torch.from_numpy(np.asarray(target).copy()))
    tl.backward(torch.from_numpy(g.copy()))
    return loss, tl.detach().numpy(), dx, tx.grad.numpy(), g


check("nn.mse_loss.reduced")(lambda: _reduced_obs("nn.mse_loss.reduced", "mse", ("sum", "mean")))
check("nn.cross_entropy")(lambda: _reduced_obs("nn.cross_entropy", "ce", ("none", "sum", "mean")))


@check("nn.saved_tensors")
def _() -> Observation:
    rng, c, bad, n = np.random.default_rng(_RNG_SEED), claim("nn.saved_tensors"), 0.0, 0
    with torch.random.fork_rng():
        torch.manual_seed(_RNG_SEED)
        for dtype in (np.float32, np.float64):
            layers = [ref.Linear(16, 8, rng=rng, dtype=dtype), ref.ReLU(), ref.Tanh(),
                      ref.GELU(), ref.GELU("tanh"), ref.Dropout(0.25, rng=rng)]
            for layer in layers:
                x = rng.standard_normal((5, 3, 16)).astype(dtype)
                layer.forward(x)
                mine = saved_signature(layer.tape())
                theirs = torch_activation_saved(torch_twin(layer), x)
                bad += measure(c, mine, theirs) if mine.shape == theirs.shape else 1
                n += 1
    return Observation(bad, n, "layers in float32 and float64, input (5, 3, 16)")


@check("nn.state_dict_roundtrip")
def _() -> Observation:
    c, bad, n = claim("nn.state_dict_roundtrip"), 0.0, 0
    for dtype in (np.float32, np.float64):
        model = ref.make_mlp((16, 64, 64, 4), rng=np.random.default_rng(_RNG_SEED), dtype=dtype)
        state = model.state_dict()
        back = tnn.state_dict_from_torch(tnn.state_dict_to_torch(state))
        for key in state:
            bad, n = bad + measure(c, back[key], state[key]), n + state[key].size
    return Observation(bad, n, "make_mlp((16, 64, 64, 4))")


@check("nn.mlp.forward")
def _() -> Observation:
    c, worst, n = claim("nn.mlp.forward"), 0.0, 0
    for dtype in (np.float32, np.float64):
        for act in ref.ACTIVATIONS:
            model = ref.make_mlp((16, 64, 64, 4), act, rng=np.random.default_rng(1), dtype=dtype)
            twin = tnn.make_mlp((16, 64, 64, 4), act, generator=torch.Generator().manual_seed(1),
                                dtype=torch.float64 if dtype == np.float64 else torch.float32)
            twin.load_state_dict(tnn.state_dict_to_torch(model.state_dict()))
            x = np.random.default_rng(2).standard_normal((32, 16)).astype(dtype)
            y, bound = mlp_forward_with_bound(model, x, {})
            ty = twin(torch.from_numpy(x)).detach().numpy()
            units = np.abs(y.astype(np.float64) - ty) / bound
            worst, n = max(worst, measure(c, units, zeros_like(units))), n + units.size
    return Observation(worst, n, "batch 32, sizes 16-64-64-4, every activation")


# ------------------------------------------------------------------ docs/model.md table


def tape_table_markdown(batch: int = 32, sizes: Sequence[int] = (16, 64, 64, 4),
                        activation: str = "gelu", dropout: float = 0.1) -> str:
    """The saved-tensor table of docs/model.md: reference tape vs torch's saved tensors."""
    model = ref.make_mlp(sizes, activation, dropout, rng=np.random.default_rng(0))
    twin = tnn.make_mlp(sizes, activation, dropout, generator=torch.Generator().manual_seed(0))
    x = np.zeros((batch, sizes[0]), dtype=np.float32)
    model.forward(x)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        theirs = tnn.measure_saved_tensors(twin, torch.from_numpy(x).requires_grad_(True))
    lines = [
        f"make_mlp({tuple(sizes)}, {activation!r}, dropout={dropout}), float32, batch {batch}:",
        "",
        "| module | layer | reference saves | torch saves (grad_fn attribute) | shape | "
        "bytes (ref) | bytes (torch, excl. weights) |",
        "|---|---|---|---|---|---:|---:|",
    ]
    total_ref = total_torch = 0
    for path, layer in model.named_modules():
        if path == "":
            continue
        mine = [s for s in model.tape() if s.module == path]
        their = [s for s in theirs if s.module == path]
        for i in range(max(len(mine), len(their))):
            m = mine[i] if i < len(mine) else None
            t = their[i] if i < len(their) else None
            ref_bytes = m.nbytes if m else 0
            torch_bytes = 0 if t is None or t.is_parameter else t.nbytes
            total_ref, total_torch = total_ref + ref_bytes, total_torch + torch_bytes
            tname = "-" if t is None else t.name + (" (weight view)" if t.is_parameter else "")
            shape = (m or t).shape  # type: ignore[union-attr]
            lines.append(f"| {path} | {layer!r} | {m.name if m else '-'} | {tname} | "
                         f"{shape} | {ref_bytes:,} | {torch_bytes:,} |")
    lines.append(f"| total | | | | | {total_ref:,} | {total_torch:,} |")
    return "\n".join(lines)
