"""Running the compact model's layers and losses in both trees, and the scales S of the nn
`eps` claims (|a - b| <= c eps S; parity/claims/nn.py says what each S is and why).

The torch side runs on `device` ("cpu" or "cuda"); every result comes back as a NumPy array.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from parity.tolerances import claim
from reference import losses as rloss
from reference import nn as ref
from torch_impl import nn as tnn
from torch_impl import saved_tensors as tsaved
from torch_impl import state_mapping as tstate

LIPSCHITZ = {"ReLU": 1.0, "Tanh": 1.0, "GELU": 1.13}  # max |f'|; GELU's is 1.12899...
TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def zeros_like(units: np.ndarray) -> np.ndarray:
    """Zeros to compare eps units against (kept for callers of the earlier `close` form)."""
    return np.zeros_like(units)


def to_torch(x: np.ndarray, device: str = "cpu", grad: bool = False) -> torch.Tensor:
    """A copy of x as a tensor on `device` (a leaf that requires grad if asked)."""
    t = torch.from_numpy(np.array(x, copy=True)).to(device)
    return t.requires_grad_(True) if grad else t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# -- running one layer on both sides
def torch_twin(layer: ref.Module, device: str = "cpu") -> torch.nn.Module:
    """The torch module matching a reference layer (its twin in torch_impl.nn: torch.nn's
    own), with the same weights (bit copies)."""
    if isinstance(layer, ref.Linear):
        twin: torch.nn.Module = tnn.Linear(
            layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta",
            dtype=TORCH_DTYPE[layer.weight.data.dtype]).to_empty(device=device)
        twin.load_state_dict(tstate.state_dict_to_torch(layer.state_dict(), device))
        return twin
    if isinstance(layer, ref.GELU):
        return tnn.GELU(approximate=layer.approximate)
    if isinstance(layer, ref.Dropout):
        return tnn.Dropout(layer.p)
    return {"ReLU": tnn.ReLU, "Tanh": tnn.Tanh}[type(layer).__name__]()


def dropout_keep(out: torch.Tensor) -> np.ndarray:
    """The keep-mask torch's dropout used, read from what its backward saved: the scaled
    noise of MulBackward0 on the CPU (NOTE [ Dropout mask ]), the bool mask of
    NativeDropoutBackward0 where torch fuses dropout (CUDA)."""
    node = out.grad_fn
    if hasattr(node, "_saved_other"):
        return to_numpy(node._saved_other != 0)
    if hasattr(node, "_saved_result1"):
        return to_numpy(node._saved_result1).astype(bool)
    raise RuntimeError(f"dropout_keep: no saved mask on {node.name()}")


def torch_layerwise(twin: torch.nn.Sequential, x: np.ndarray, g: np.ndarray
                    ) -> tuple[list[torch.Tensor], list[np.ndarray | None]]:
    """Run a torch Sequential layer by layer, keeping every activation (with its grad after
    backward of g) and each Dropout's keep-mask, so reference layers can be fed the same.
    The tensors stay on the model's device."""
    device = next(twin.parameters()).device
    acts = [to_torch(x, device, grad=True)]
    masks: list[np.ndarray | None] = []
    for module in twin:
        out = module(acts[-1])
        dropped = isinstance(module, torch.nn.Dropout) and module.training and 0 < module.p < 1
        masks.append(dropout_keep(out) if dropped else None)
        out.retain_grad()
        acts.append(out)
    acts[-1].backward(to_torch(g, device))
    return acts, masks


def run_torch(module: torch.nn.Module, x: np.ndarray, g: np.ndarray, device: str = "cpu"
              ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """y, dx, parameter grads, and Dropout's keep-mask (from what it saved) if any."""
    module = module.to(device)
    tx = to_torch(x, device, grad=True)
    ty = module(tx)
    keep = None
    if isinstance(module, torch.nn.Dropout) and ty.grad_fn is not None and module.p < 1:
        keep = dropout_keep(ty)
    ty.backward(to_torch(g, device))
    grads = {k: to_numpy(p.grad) for k, p in module.named_parameters()}
    return to_numpy(ty), to_numpy(tx.grad), grads, keep


def run_ref(layer: ref.Module, x: np.ndarray, g: np.ndarray, keep: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """y, dx and parameter grads of a reference layer (Dropout fed `keep` if given)."""
    layer.zero_grad()
    y = layer.forward(x, mask=keep) if isinstance(layer, ref.Dropout) else layer.forward(x)
    dx = layer.backward(g)
    return y, dx, {k: p.grad for k, p in layer.named_parameters()}


# -- the scales S of the eps claims
def linear_scales(layer: ref.Linear, x: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray]:
    """(k + 1) |A||B| (+ |b|) for y, dx, dW, db: the scale S of claim nn.linear."""
    w = np.abs(layer.weight.data.astype(np.float64))
    x2 = np.abs(x.astype(np.float64)).reshape(-1, layer.in_features)
    g2 = np.abs(g.astype(np.float64)).reshape(-1, layer.out_features)
    n = x2.shape[0]
    b = 0.0 if layer.bias is None else np.abs(layer.bias.data.astype(np.float64))
    return {
        "y": ((layer.in_features + 1) * (x2 @ w.T + b)).reshape(g.shape),
        "dx": ((layer.out_features + 1) * (g2 @ w)).reshape(x.shape),
        "weight": (n + 1) * (g2.T @ x2),
        "bias": (n + 1) * g2.sum(axis=0),
    }


def activation_claims(layer: ref.Module) -> tuple[str, str]:
    """(forward claim, backward claim) of Tanh and the two GELUs."""
    if isinstance(layer, ref.Tanh):
        return "nn.tanh.forward", "nn.tanh.backward"
    if isinstance(layer, ref.GELU):
        stem = "nn.gelu_tanh" if layer.approximate == "tanh" else "nn.gelu"
        return f"{stem}.forward", f"{stem}.backward"
    raise TypeError(f"no eps claim for {layer!r}")


def activation_scales(layer: ref.Module, x: np.ndarray, y: np.ndarray, g: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(S_forward, S_backward) of the activation claims."""
    ax, ag = np.abs(x.astype(np.float64)), np.abs(g.astype(np.float64))
    if isinstance(layer, ref.Tanh):
        return np.abs(y.astype(np.float64)), ag
    return ax, ag * (1.0 + ax * (1.0 + ax * ax))


def mse_scale(reduction: str, x: np.ndarray, target: np.ndarray) -> np.ndarray:
    """S of nn.mse_loss.reduced: (n + 1) sum (x - t)^2, divided by n for 'mean'."""
    d2 = (x.astype(np.float64) - target.astype(np.float64)) ** 2
    s = (d2.size + 1) * d2.sum()
    return np.asarray(s / d2.size if reduction == "mean" else s)


# NOTE [ Cross-entropy error budget ] (parity/claims/nn.py, nn.cross_entropy): with C classes,
# each log-probability differs between the trees by at most eps (A + |logp|), A = C + 5 +
# 5 log C; a reduction over N rows adds (N - 1) eps sum |nll| (any summation order) and, for
# 'mean', one rounding of the division.
def ce_scales(reduction: str, x: np.ndarray, target: np.ndarray, g: np.ndarray,
              dx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S_loss, S_grad) of nn.cross_entropy for logits x (N, C) or (C,), classes target, the
    incoming gradient g and the reference's input gradient dx."""
    x64 = np.atleast_2d(x.astype(np.float64))  # (N, C)
    batch, classes = x64.shape
    shifted = x64 - x64.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (N, C)
    nll = -np.take_along_axis(logp, np.atleast_1d(target).reshape(-1, 1), axis=-1)[:, 0]
    a = classes + 5 + 5 * np.log(classes)
    s_nll = a + np.abs(nll)  # (N,)
    if reduction == "none" or x.ndim == 1:
        s_loss = s_nll.reshape(np.shape(target))
    else:
        s_sum = s_nll.sum() + (batch - 1) * nll.sum()
        s_loss = np.asarray(s_sum / batch + nll.mean() if reduction == "mean" else s_sum)
    g64 = np.abs(np.asarray(g, dtype=np.float64))
    if reduction == "none":
        g_row = g64.reshape(-1, 1)  # (N, 1): each row's incoming gradient
    else:  # one scalar, divided by N (identically in both trees) for 'mean'
        g_row = np.full((batch, 1), float(g64) / (batch if reduction == "mean" and x.ndim == 2
                                                 else 1))
    finfo = np.finfo(x.dtype)
    tiny = float(finfo.smallest_subnormal) / float(finfo.eps)  # underflow: absolute, in eps
    s_grad = g_row * np.exp(logp) * (a + 6 + np.abs(logp)) + np.abs(
        np.atleast_2d(dx.astype(np.float64))) + (5 * g_row + 2) * tiny
    return s_loss, s_grad.reshape(x.shape)


# -- the losses on both sides
def loss_pair(kind: str, x: np.ndarray, t: np.ndarray, rng: np.random.Generator,
              reduction: str, device: str = "cpu") -> tuple[np.ndarray, ...]:
    """(loss, torch loss, dx, torch dx, g, target) for one loss ("mse" or "ce") on given
    inputs; the cross-entropy target classes are drawn from `rng`, the MSE target is t."""
    if kind == "mse":
        r, tm, target = rloss.MSELoss(reduction), torch.nn.MSELoss(reduction=reduction), t
    else:
        target = rng.integers(0, x.shape[-1], x.shape[:-1])
        r = rloss.CrossEntropyLoss(reduction)
        tm = torch.nn.CrossEntropyLoss(reduction=reduction)
    loss = np.asarray(r(x, target))
    g = np.full(loss.shape, 0.75, dtype=x.dtype)
    dx = r.backward(g)
    tx = to_torch(x, device, grad=True)
    tl = tm(tx, to_torch(np.asarray(target), device))
    tl.backward(to_torch(g, device))
    return loss, to_numpy(tl), dx, to_numpy(tx.grad), g, np.asarray(target)


# -- saved tensors
def saved_signature(entries: Sequence[ref.SavedTensor | tsaved.SavedTensor]) -> np.ndarray:
    """One int64 row per saved tensor: ndim, shape (padded to 4), dtype kind, itemsize, bytes."""
    rows = []
    for e in entries:
        dtype = np.dtype(e.dtype)
        rows.append([len(e.shape), *e.shape, *([-1] * (4 - len(e.shape))), ord(dtype.kind),
                     dtype.itemsize, e.nbytes])
    return np.array(sorted(rows), dtype=np.int64).reshape(-1, 8)


def torch_activation_saved(module: torch.nn.Module, x: np.ndarray, device: str = "cpu"
                           ) -> np.ndarray:
    """The signature of what torch saves, parameters excluded (the reference reads those)."""
    entries = [s for s in tsaved.measure_saved_tensors(module.to(device), to_torch(x, device, True))
               if not s.is_parameter]
    return saved_signature(entries)


# -- the whole model
def mlp_forward_with_bound(model: ref.Sequential, x: np.ndarray,
                           masks: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The reference output and S of nn.mlp.forward: the first-order bound on
    |y_ref - y_torch|, in units of eps.

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
            c = float(claim(activation_claims(layer)[0]).bound)  # type: ignore[arg-type]
            scale = activation_scales(layer, x, y, np.zeros_like(x))[0]
            e = LIPSCHITZ[type(layer).__name__] * e + c * eps * scale
        x = y
    model.free_saved()
    return x, e / eps
