"""bfloat16 weights without a float32 master copy: AdamW whose update is Kahan-compensated.

A bf16 weight p rounded to nearest after each update loses every update smaller than half
its spacing s: p never moves. Kahan summation keeps what the rounding dropped in a second
bf16 buffer c, the compensation, and adds it back before the next update, so p + c follows
the exact sum of the updates though p alone is a bf16 value (Zamirai et al., "Revisiting
BFloat16 Training", 2020). Stochastic rounding (reference/optim_sr.py) is the other route:
unbiased in expectation, no extra buffer, but noisy.

The sources, read at these commits:
- "anyprecision" (the default): torchdistx's AnyPrecisionAdamW,
  src/python/torchdistx/optimizers/anyprecision_optimizer.py at pytorch/torchdistx
  9c1b9f5cb2fa36bfb8b70ec07c40ed42a33cc87a, `use_kahan_summation=True` with its default
  dtypes: momentum float32, variance bfloat16, compensation bfloat16.
- "optimi": torch-optimi's AdamW (optimi/adamw.py -> optimi/adam.py `_single_param_adam`,
  debias_beta in optimi/utils.py) at warner-benjamin/optimi
  17a3d5422f3e41bb8973e1e4c9b39206c0d93b6d, `kahan_sum=True`: every state entry in the
  parameter's dtype, Adam's bias corrections folded into the betas.
AnyPrecisionAdamW is the default: optimi's Kahan step is "directly inspired by" it (optimi's
docs/kahan_summation.md) and is the same three lines; AnyPrecisionAdamW's Adam is torch's
(lr / c1 and sqrt(v) / sqrt(c2) + eps), the update AdamWSR and reference.optim.AdamW make,
so the three bf16 weight rules differ in how the weight is rounded, not in Adam.

Every operation is a torch kernel on CPU: it computes in float32 and rounds its result once
to the tensor it writes (bf16(x) below: float32 to bfloat16, nearest-even; f32(x): float32).
The hyperparameters are Python floats cast to float32 where they meet a tensor; fma is one
rounding (NOTE [ FMA in torch's CPU kernels ], reference/fma.py):

    anyprecision (m float32, v bfloat16, c bfloat16; t a float32 0-d tensor):
        t <- t + 1
        p <- bf16(p * f32(1 - lr * wd))                     if wd != 0 (before the update)
        m <- fma(g, f32(1 - beta1), f32(m * beta1))
        v <- bf16(v * beta2); v <- bf16(fma(f32((1 - beta2) * g), g, v))
        step_size = f32(f32(1 / c1) * lr),  c1 = f32(1 - pow(beta1, t))   Tensor.__rdiv__
        c2 = sqrt(f32(1 - pow(beta2, t)))                          (1 - beta2**t) ** 0.5
        d = bf16(bf16(bf16(sqrt(v)) / c2) + eps)                     centered_variance
        u = f32(f32(-step_size * m) / d)                               the update
    optimi (m, v, c in p's dtype; k = t as an integer; beta_hat = debias_beta(beta, k)
    = (beta**k - beta) / (beta**k - 1) in Python floats):
        t <- t + 1
        p <- bf16(p * f32(1 - lr * wd))                     if wd != 0
        m <- bf16(lerp(m, g, f32(1 - beta1_hat)))
        v <- bf16(v * beta2_hat); v <- bf16(fma(f32((1 - beta2_hat) * g), g, v))
        d = bf16(bf16(sqrt(v)) + eps)
        u = f32(f32(-lr * m) / d)
    then, in both (the Kahan step, `kahan=True`):
        c  <- bf16(c + u)                  compensation.addcdiv_(m, d, value=-step_size)
        p' =  bf16(p + c)                  p.add_(compensation), the old p kept
        c  <- bf16(c + bf16(p - p'))       compensation.add_(old.sub_(p)): what p' dropped
        p  <- p'
    or, `kahan=False` (plain: the weight rounded to nearest):
        p <- bf16(p + u)                   p.addcdiv_(m, d, value=-step_size)

NOTE [ What the compensation holds ]: while |c + u| < s, the spacing at p, p' is p or one
of its neighbours, so p - p' is exact, and c + (p - p') is the exact error of p', at most
s / 2: exact in bf16 too. The only loss is the first line's rounding of c + u to bf16,
at most 2^-9 s (c + u lies below s, where bf16's spacing is s 2^-8): p + c is the exact sum
of the updates within k 2^-9 s after k steps, though p alone would stop (claim
optim.kahan_tracks_master). Weight decay multiplies p itself in both sources: a decay below
half a spacing is lost, Kahan or not.

NOTE [ A 0-d parameter's denominator ]: AnyPrecisionAdamW divides bf16 sqrt(v) by c2, a
float32 0-d tensor. torch's type promotion lets a 0-d tensor decide the result's dtype only
among 0-d operands: for a parameter with dimensions the quotient is bf16, for a 0-d one it is
float32 (and so is d = quotient + eps). The reference writes d in that dtype.

Square roots: torch's bf16 sqrt computes in float32 and is IEEE's (np.sqrt, checked on all
65,536 codes); a float32 tensor's sqrt, c2's here, is MKL's (NOTE [ torch's CPU sqrt is
MKL's ], reference/optim.py), so it is `sqrt=`. torch's float32 pow of a 0-d tensor is
glibc's powf, not correctly rounded; the reference's `pow=` rounds the float64 power of
the float32 operands to float32 (claim optim.kahan_twins passes torch's).
Where this differs from the sources: optimi keeps one int32 step per group, here a float32
step per parameter (equal while every parameter gets a gradient each step); optimi uses the
gradient as its scratch buffer (the values are the same, the gradient is left alone here).
AnyPrecisionAdamW's weight_decay defaults to 0.0 in its code (its docstring says 1e-2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ml_dtypes
import numpy as np

from reference.fma import fma, lerp
from reference.formats import encode
from reference.optim import Optimizer

_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
VARIANTS = ("anyprecision", "optimi")


def pow32(base: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """float32 base ** float32 exponent: the float64 power rounded to float32."""
    return np.float32(np.power(np.float64(base), np.float64(exponent)))


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _check_variant(variant: str) -> None:
    """One line naming the variants."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def _check_step(kahan: bool, dtypes: list[tuple[object, object]]) -> None:
    """One line when a parameter or its gradient has a dtype the step cannot take
    (`dtypes`: each parameter's and its gradient's)."""
    for p_dtype, g_dtype in dtypes:
        p_name, g_name = _dtype_name(p_dtype), _dtype_name(g_dtype)
        if p_name not in ("bfloat16", "float32"):
            raise TypeError(f"AdamWKahan: parameters must be bfloat16 or float32, got {p_name}")
        if g_name != p_name:
            raise TypeError(f"AdamWKahan: a {p_name} parameter has a {g_name} gradient")
        if kahan and p_name != "bfloat16":
            raise TypeError(f"AdamWKahan: kahan=True needs bfloat16 parameters, got {p_name}")


def _widen(a: np.ndarray) -> np.ndarray:
    """A bfloat16 or float32 array as float32, exact."""
    return np.asarray(a).astype(np.float32)


def _round(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 `x` written into a tensor of `dtype`: bfloat16 nearest-even, or as is."""
    if dtype == _BF16:
        return encode(x, "bfloat16").astype(np.uint16).view(_BF16).reshape(np.shape(x))
    return np.asarray(x, dtype=np.float32)


class AdamWKahan(Optimizer):
    """AdamW on bfloat16 parameters, the update Kahan-compensated (AnyPrecisionAdamW with
    use_kahan_summation=True; variant="optimi": optimi's AdamW with kahan_sum=True).
    `kahan=False` is the same AdamW rounding each new weight to nearest (plain bf16 AdamW;
    on float32 parameters, an fp32 master run). State: {"step" (float32 0-d), "exp_avg",
    "exp_avg_sq", "compensation" if kahan}, in the dtypes the module docstring lists."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, kahan: bool = True,
                 variant: str = "anyprecision", fma: bool = True,
                 sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt,
                 pow: Callable[[np.ndarray, np.ndarray], np.ndarray] = pow32) -> None:
        self._check_adam(lr, betas, eps)  # neither source checks; torch's Adam's checks
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_variant(variant)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "kahan": kahan, "variant": variant}
        super().__init__(params, defaults, fma)
        self.sqrt, self.pow = sqrt, pow  # NOTE [ torch's CPU sqrt is MKL's ]

    def step(self) -> None:  # type: ignore[override]
        """One update of every parameter with a gradient."""
        todo = [(group, p) for group in self.param_groups for p in group["params"]
                if p.grad is not None]
        for group in self.param_groups:
            _check_variant(group["variant"])
            _check_step(group["kahan"], [(p.data.dtype, p.grad.dtype) for p in group["params"]
                                         if p.grad is not None])
        f32 = np.float32
        for group, p in todo:
            (beta1, beta2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
            anyprecision = group["variant"] == "anyprecision"
            pdt = p.data.dtype
            mdt, vdt = (_F32, _BF16) if anyprecision else (pdt, pdt)
            state = self.state.setdefault(p, {})
            if not state:  # lazy initialization, as both sources
                state["step"] = np.array(0.0, dtype=np.float32)
                state["exp_avg"] = np.zeros(p.data.shape, mdt)
                state["exp_avg_sq"] = np.zeros(p.data.shape, vdt)
                if group["kahan"]:
                    state["compensation"] = np.zeros_like(p.data)
            state["step"] += f32(1)
            t = state["step"]
            p32, g32 = _widen(p.data), _widen(p.grad)
            if wd != 0:
                p32 = _widen(_round(p32 * f32(1 - lr * wd), pdt))
            if anyprecision:
                m32 = fma(g32, f32(1 - beta1), _widen(state["exp_avg"]) * f32(beta1), self.fma)
                v32 = _widen(_round(_widen(state["exp_avg_sq"]) * f32(beta2), vdt))
                v32 = _widen(_round(fma(f32(1 - beta2) * g32, g32, v32, self.fma), vdt))
                c1 = f32(1) - self.pow(f32(beta1), t)
                step_size = (f32(1) / c1) * f32(lr)
                c2 = self.sqrt(f32(1) - self.pow(f32(beta2), t))
                ddt = vdt if p.data.ndim else _F32  # NOTE [ A 0-d parameter's denominator ]
                d = _widen(_round(_widen(_round(self._sqrt(v32, vdt), vdt)) / c2, ddt))
                d = _widen(_round(d + f32(group["eps"]), ddt))
                u = (-step_size * m32) / d
            else:
                k = int(t)
                beta1_hat = (beta1**k - beta1) / (beta1**k - 1)
                beta2_hat = (beta2**k - beta2) / (beta2**k - 1)
                m32 = _widen(_round(lerp(_widen(state["exp_avg"]), g32, f32(1 - beta1_hat),
                                         self.fma), mdt))
                v32 = _widen(_round(_widen(state["exp_avg_sq"]) * f32(beta2_hat), vdt))
                v32 = _widen(_round(fma(f32(1 - beta2_hat) * g32, g32, v32, self.fma), vdt))
                d = _widen(_round(self._sqrt(v32, vdt), vdt))
                d = _widen(_round(d + f32(group["eps"]), vdt))
                u = (f32(-lr) * m32) / d
            state["exp_avg"], state["exp_avg_sq"] = _round(m32, mdt), _round(v32, vdt)
            if group["kahan"]:
                c32 = _widen(_round(_widen(state["compensation"]) + u, _BF16))
                new = _widen(_round(p32 + c32, pdt))
                c32 = _widen(_round(c32 + _widen(_round(p32 - new, pdt)), _BF16))
                state["compensation"] = _round(c32, _BF16)
                p32 = new
            else:
                p32 = p32 + u
            np.copyto(p.data, _round(p32, pdt))

    def _sqrt(self, v32: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """torch's sqrt of a tensor of `dtype`: IEEE's on bfloat16, `sqrt=` on float32."""
        return np.sqrt(v32) if dtype == _BF16 else self.sqrt(v32)
