"""AdamW on bfloat16 weights with stochastic rounding, in torch's eager ops. See
reference/optim_sr.py for the rule, the step and the NaN variants.

What PyTorch does differently or hides:
- The rounding is written as torchao 0.18.0 writes it (`_fp32_to_bf16_sr`): on the float32
  bits viewed as int32, since torch has no uint32 arithmetic on most ops; `kept + 0x10000`
  wraps as two's complement where the reference's uint32 wraps mod 2^32, the same bits.
- The draws are explicit here too (NOTE [ SR draws are explicit ] in reference/optim_sr.py):
  torchao draws them inside its call with `torch.randint(0, 1 << 16, shape, dtype=int32)`
  from the global generator; a caller reproduces them by seeding and drawing the same.
- `.bfloat16()` of a NaN writes torch's own NaN pattern (0xFFFF on this CPU), which
  variant="torchao" keeps: that variant is held to torchao as a NaN class.
- The step runs eagerly, one CPU kernel per op: lerp with a scalar weight is one FMA per
  rounding on AVX2/AVX512 builds (NOTE [ FMA in torch's CPU kernels ] in reference/fma.py),
  and sqrt is MKL VML's (NOTE [ torch's CPU sqrt is MKL's ] in reference/optim.py), not
  torchao's compiled (inductor) step's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

VARIANTS = ("ieee", "torchao")


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _check_draws(x_shape: tuple[int, ...], x_dtype: object, draws_shape: tuple[int, ...],
                 draws_dtype: object, low: int, high: int) -> None:
    """The reference's checks, its lines."""
    if _dtype_name(x_dtype) != "float32":
        raise TypeError(f"round_bf16_stochastic: x must be float32, got {_dtype_name(x_dtype)}")
    name = _dtype_name(draws_dtype)
    if not name.startswith(("int", "uint")):
        raise TypeError(f"round_bf16_stochastic: draws must be integers, got {name}")
    if tuple(draws_shape) != tuple(x_shape):
        raise ValueError(f"round_bf16_stochastic: draws must have x's shape "
                         f"{tuple(x_shape)}, got {tuple(draws_shape)}")
    if low < 0 or high >= 1 << 16:
        raise ValueError("round_bf16_stochastic: draws must lie in [0, 2^16)")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def round_bf16_stochastic(x: torch.Tensor, draws: torch.Tensor, *, variant: str = "ieee"
                          ) -> torch.Tensor:
    """float32 `x` rounded to bfloat16, away from zero iff draws < the 16 dropped bits."""
    _check_variant(variant)
    for name, t in (("x", x), ("draws", draws)):  # the reference takes array-likes (asarray)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"round_bf16_stochastic: {name} must be a torch.Tensor, got "
                            f"{type(t).__name__}")
    _check_draws(tuple(x.shape), x.dtype, tuple(draws.shape), draws.dtype,
                 int(draws.min()) if draws.numel() else 0,
                 int(draws.max()) if draws.numel() else 0)
    bits = x.view(torch.int32)
    low = bits & 0xFFFF
    kept = bits & -0x10000  # 0xFFFF0000 as an int32
    up = draws.to(torch.int32) < low
    rounded = torch.where(up, kept + 0x10000, kept)  # wraps as two's complement
    y = rounded.view(torch.float32).bfloat16()  # exact: the low 16 bits are zero
    if variant == "ieee":
        sign = (bits < 0).to(torch.int16) * -0x8000  # 0x8000 as an int16
        nan = (sign | 0x7FC0).view(torch.bfloat16)
        y = torch.where(torch.isnan(x), nan, y)
    return y


class AdamWSR(torch.optim.Optimizer):
    """The reference's AdamWSR (torchao's _AdamW with bf16_stochastic_round=True) in eager
    torch ops; the same state entries, dtypes and order of operations."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False) -> None:
        _check_hyperparameters(lr, betas, eps)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, draws: Sequence[torch.Tensor]) -> None:  # type: ignore[override]
        """One update of every parameter with a gradient, rounded with its draws."""
        todo = [(group, p) for group in self.param_groups for p in group["params"]
                if p.grad is not None]
        _check_step(len(todo), len(draws), [d for _, p in todo for d in (p.dtype,
                                                                          p.grad.dtype)])
        for (group, p), r in zip(todo, draws, strict=True):
            (beta1, beta2), wd = group["betas"], group["weight_decay"]
            state = self.state[p]
            if not state:  # lazy initialization, as torchao
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            t = state["step"]
            p32, g32 = p.float(), p.grad.float()
            lr = torch.tensor(group["lr"], dtype=torch.float32)
            p32 = p32 - lr * wd * p32
            c1 = 1 - beta1**t
            c2 = 1 - beta2**t
            m32 = state["exp_avg"].float().lerp(g32, 1 - beta1)
            v32 = state["exp_avg_sq"].float().lerp(g32.square(), 1 - beta2)
            state["exp_avg"].copy_(m32)
            state["exp_avg_sq"].copy_(v32)
            if group["amsgrad"]:
                v32 = torch.maximum(state["max_exp_avg_sq"].float(), v32)
                state["max_exp_avg_sq"].copy_(v32)
            denom = v32.sqrt() / c2.sqrt() + group["eps"]
            p32 = p32 - lr * (m32 / c1) / denom
            p.copy_(round_bf16_stochastic(p32, r))


def _check_hyperparameters(lr: float, betas: tuple[float, float], eps: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")


def _check_step(n_params: int, n_draws: int, dtypes: list[object]) -> None:
    if n_draws != n_params:
        raise ValueError(f"AdamWSR.step: {n_draws} draws for {n_params} parameters with "
                         "gradients")
    for dtype in dtypes:
        if _dtype_name(dtype) != "bfloat16":
            raise TypeError(f"AdamWSR: parameters and gradients must be bfloat16, got "
                            f"{_dtype_name(dtype)}")
