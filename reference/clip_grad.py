"""Gradient clipping by global norm, as torch.nn.utils.clip_grad (the same three functions).

    total_norm = || (||g_1||, ..., ||g_m||) ||          get_total_norm: a norm of norms
    coef       = f32(f32(1 / f32(total_norm + 1e-6)) * f32(max_norm))
    coef       = min(coef, 1)                            NaN stays NaN (torch.clamp)
    g_i       <- f32(g_i * coef)                         clip_grads_with_norm_, for every i

torch multiplies by the clamped coefficient even when it is 1 (no branch, so no device
sync); `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__, i.e. reciprocal() * max_norm,
and a Python float meets a float32 tensor as a float32 scalar. A non-finite norm poisons the
step: an inf norm gives the coefficient 1 / inf * max_norm = 0 (finite gradients become 0,
infinite ones NaN), a NaN norm a NaN coefficient (every gradient NaN). The scaler skips the
step when a gradient is inf or NaN; finite gradients whose squares overflow (a float32 norm
above 1.8e19) give an inf norm too, and that step applies a zero update, unflagged.

The norms are sums of squares in float32, in an order that is each library's own (NumPy's
pairwise sum here, torch's vectorized reduction there): each is within gamma_n of the exact
value, so two implementations agree to about n float32 ulps, not bit for bit (the bound:
parity/claims/loss_scaling.py, `loss_scaling.clip_grad_norm`). The coefficient and the multiply
are the same IEEE operations in the same order on both sides: given one total norm, the
clipped gradients are bit-identical (`loss_scaling.clip`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from reference.nn import Parameter

__all__ = ["clip_grad_norm_", "clip_grads_with_norm_", "get_total_norm"]


def get_total_norm(grads: Iterable[np.ndarray], norm_type: float = 2.0) -> np.ndarray:
    """The 2-norm of the per-tensor 2-norms, in the gradients' dtype (0-d; 0.0 for none)."""
    if norm_type != 2.0:
        raise ValueError(f"get_total_norm: only norm_type=2.0 is implemented, got {norm_type}")
    grads = list(grads)
    if not grads:
        return np.array(0.0, dtype=np.float32)
    dtypes = {g.dtype for g in grads}
    if len(dtypes) != 1 or grads[0].dtype not in (np.float32, np.float64):
        raise TypeError(f"get_total_norm: expected float32 or float64 gradients of one dtype, "
                        f"got {sorted(str(d) for d in dtypes)}")
    dt = grads[0].dtype.type
    with np.errstate(over="ignore", invalid="ignore"):  # huge or inf gradients: an inf norm
        norms = np.array([np.sqrt(np.sum(g * g, dtype=dt)) for g in grads], dtype=dt)
        return np.asarray(np.sqrt(np.sum(norms * norms, dtype=dt)))


def clip_grads_with_norm_(parameters: Iterable[Parameter], max_norm: float,
                          total_norm: np.ndarray) -> None:
    """g <- g * min(1, max_norm / (total_norm + 1e-6)) for every gradient, in place."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    total = np.asarray(total_norm)
    dt = total.dtype.type
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        clip_coef = (dt(1) / (total + dt(1e-6))) * dt(max_norm)  # reciprocal() * max_norm
        clip_coef_clamped = np.minimum(clip_coef, dt(1.0))  # NaN stays NaN, as torch.clamp
        for g in grads:
            g *= clip_coef_clamped  # inf gradients times a zero or NaN coefficient: NaN


def clip_grad_norm_(parameters: Iterable[Parameter], max_norm: float,
                    norm_type: float = 2.0) -> np.ndarray:
    """Clip the gradients to a global 2-norm of max_norm; return the norm before clipping."""
    parameters = list(parameters)
    total_norm = get_total_norm([p.grad for p in parameters if p.grad is not None], norm_type)
    clip_grads_with_norm_(parameters, max_norm, total_norm)
    return total_norm
