"""AdamW on bfloat16 weights with Kahan-compensated updates, in torch's eager ops. See
reference/optim_kahan.py for the rule, the sources and the variants.

What PyTorch does differently or hides:
- The step is written as the sources write it: in-place ops on tensors of the state's own
  dtypes (AnyPrecisionAdamW's `compensation.addcdiv_(...)`, `p.data.add_(compensation)`,
  `compensation.add_(temp_buffer.sub_(p.data))`). Each kernel converts its bf16 operands
  to float32, computes there, and rounds its result once to the tensor it writes; a kernel
  mixing a float32 and a bf16 tensor (exp_avg and centered_variance) computes in float32.
- `lr / bias_correction1` with a tensor on the right is Tensor.__rdiv__: reciprocal()
  then * lr, two roundings, not one float32 division.
- `beta1 ** step` on a float32 0-d tensor is glibc's powf; `(1 - beta2**step) ** 0.5` is
  MKL's sqrt (NOTE [ torch's CPU sqrt is MKL's ] in reference/optim.py); the sqrt of a
  bf16 tensor is the float32 vector sqrt, IEEE's.
- add(alpha=), addcmul and lerp with a scalar weight are one FMA per element on AVX2/AVX512
  builds (NOTE [ FMA in torch's CPU kernels ] in reference/fma.py); addcdiv is unfused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from torch_impl.optim_sr import _check_hyperparameters

VARIANTS = ("anyprecision", "optimi")


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def _check_step(kahan: bool, dtypes: list[tuple[object, object]]) -> None:
    """The reference's checks, its lines."""
    for p_dtype, g_dtype in dtypes:
        p_name, g_name = _dtype_name(p_dtype), _dtype_name(g_dtype)
        if p_name not in ("bfloat16", "float32"):
            raise TypeError(f"AdamWKahan: parameters must be bfloat16 or float32, got {p_name}")
        if g_name != p_name:
            raise TypeError(f"AdamWKahan: a {p_name} parameter has a {g_name} gradient")
        if kahan and p_name != "bfloat16":
            raise TypeError(f"AdamWKahan: kahan=True needs bfloat16 parameters, got {p_name}")


class AdamWKahan(torch.optim.Optimizer):
    """The reference's AdamWKahan (AnyPrecisionAdamW with use_kahan_summation=True; variant
    "optimi": optimi's AdamW with kahan_sum=True) in eager torch ops; the same state
    entries, dtypes and order of operations."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, kahan: bool = True,
                 variant: str = "anyprecision") -> None:
        _check_hyperparameters(lr, betas, eps)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_variant(variant)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "kahan": kahan, "variant": variant}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        """One update of every parameter with a gradient."""
        todo = [(group, p) for group in self.param_groups for p in group["params"]
                if p.grad is not None]
        for group in self.param_groups:
            _check_variant(group["variant"])
            _check_step(group["kahan"], [(p.dtype, p.grad.dtype) for p in group["params"]
                                         if p.grad is not None])
        for group, p in todo:
            (beta1, beta2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            anyprecision = group["variant"] == "anyprecision"
            mdt, vdt = (torch.float32, torch.bfloat16) if anyprecision else (p.dtype, p.dtype)
            state = self.state[p]
            if not state:  # lazy initialization, as both sources
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, dtype=mdt)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=vdt)
                if group["kahan"]:
                    state["compensation"] = torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            exp_avg, exp_avg_sq, grad = state["exp_avg"], state["exp_avg_sq"], p.grad
            if wd != 0:
                p.mul_(1 - lr * wd)
            if anyprecision:
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1**t)
                denom_correction = (1 - beta2**t) ** 0.5
                d = (exp_avg_sq.sqrt() / denom_correction).add_(group["eps"], alpha=1)
                value = -step_size
            else:
                k = int(t.item())
                beta1_hat = (beta1**k - beta1) / (beta1**k - 1)
                beta2_hat = (beta2**k - beta2) / (beta2**k - 1)
                exp_avg.lerp_(grad, weight=1 - beta1_hat)
                exp_avg_sq.mul_(beta2_hat).addcmul_(grad, grad, value=1 - beta2_hat)
                d = exp_avg_sq.sqrt().add_(group["eps"])
                value = -lr
            if group["kahan"]:
                compensation = state["compensation"]
                compensation.addcdiv_(exp_avg, d, value=value)
                old = p.detach().clone()
                p.add_(compensation)
                compensation.add_(old.sub_(p))
            else:
                p.addcdiv_(exp_avg, d, value=value)
