"""Running one layer (or a Sequential) of the compact model in both trees, and the
scales S of the nn eps claims."""

from __future__ import annotations

import numpy as np
import torch

from reference import nn as ref
from torch_impl import nn as tnn

LIPSCHITZ = {"ReLU": 1.0, "Tanh": 1.0, "GELU": 1.13}  # max |f'|; GELU's is 1.12899...


def zeros_like(units: np.ndarray) -> np.ndarray:
    return np.zeros_like(units)


def _np(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


# -- running one layer on both sides
def torch_twin(layer: ref.Module) -> torch.nn.Module:
    """The torch module matching a reference layer, with the same weights (bit copies)."""
    if isinstance(layer, ref.Linear):
        dtype = torch.float64 if layer.weight.data.dtype == np.float64 else torch.float32
        twin: torch.nn.Module = torch.nn.Linear(layer.in_features, layer.out_features,
                                                bias=layer.bias is not None, device="meta",
                                                dtype=dtype).to_empty(device="cpu")
        twin.load_state_dict(tnn.state_dict_to_torch(layer.state_dict()))
        return twin
    if isinstance(layer, ref.GELU):
        return torch.nn.GELU(approximate=layer.approximate)
    if isinstance(layer, ref.Dropout):
        return torch.nn.Dropout(layer.p)
    return {"ReLU": torch.nn.ReLU, "Tanh": torch.nn.Tanh}[type(layer).__name__]()


def torch_layerwise(twin: torch.nn.Sequential, x: np.ndarray, g: np.ndarray
                    ) -> tuple[list[torch.Tensor], list[np.ndarray | None]]:
    """Run a torch Sequential layer by layer, keeping every activation (with its grad after
    backward of g) and each Dropout's keep-mask, so reference layers can be fed the same."""
    acts = [torch.from_numpy(x.copy()).requires_grad_(True)]
    masks: list[np.ndarray | None] = []
    for module in twin:
        out = module(acts[-1])
        dropped = isinstance(module, torch.nn.Dropout) and module.training
        masks.append((out.grad_fn._saved_other != 0).numpy() if dropped else None)
        out.retain_grad()
        acts.append(out)
    acts[-1].backward(torch.from_numpy(g.copy()))
    return acts, masks


def run_torch(module: torch.nn.Module, x: np.ndarray, g: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """y, dx, parameter grads, and Dropout's keep-mask (from the saved noise) if any."""
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty = module(tx)
    keep = None
    if isinstance(module, torch.nn.Dropout) and ty.grad_fn is not None and module.p < 1:
        keep = (ty.grad_fn._saved_other != 0).numpy()
    ty.backward(torch.from_numpy(g.copy()))
    grads = {k: p.grad.numpy() for k, p in module.named_parameters()}
    return ty.detach().numpy(), tx.grad.numpy(), grads, keep


def run_ref(layer: ref.Module, x: np.ndarray, g: np.ndarray, keep: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """y, dx and parameter grads of a reference layer (Dropout fed `keep` if given)."""
    layer.zero_grad()
    y = layer.forward(x, mask=keep) if isinstance(layer, ref.Dropout) else layer.forward(x)
    dx = layer.backward(g)
    return y, dx, {k: p.grad for k, p in layer.named_parameters()}


def linear_scales(layer: ref.Linear, x: np.ndarray, g: np.ndarray) -> dict[str, np.ndarray]:
    """(k + 1) |A||B| (+ |b|) for y, dx, dW, db: the units of claim nn.linear."""
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
