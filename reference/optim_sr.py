"""bfloat16 weights without a float32 master copy: AdamW whose update is rounded stochastically.

Pretraining with bf16 weights and no fp32 copy loses every update smaller than half a bf16
spacing if the new weight is rounded to nearest: the weight never moves. Rounding it
stochastically, up with the probability of the distance already covered, makes the rounding
unbiased: E[SR(x)] = x, so small updates survive in expectation.

The rounding (torchao 0.18.0's `_fp32_to_bf16_sr`, torchao/optim/quant_utils.py; llm.c's
`stochastic_rounding` is the same rule), for a float32 x with bits [a31 .. a16 | a15 .. a0]
and a draw r uniform in [0, 2^16):

    low = bits(x) & 0xFFFF                    the 16 bits bfloat16 drops
    kept = bits(x) & 0xFFFF0000               x rounded toward zero
    bits(y) = kept + 0x10000  if r < low      away from zero, with probability low / 2^16
              kept            otherwise
    y = the upper 16 bits of bits(y)          exact: the lower 16 are zero

The caller passes the draws r (NOTE [ SR draws are explicit ]). Exact bf16 values (low = 0)
never move; the largest finite float32 rounds to inf when it rounds up; +-inf stay; a
subnormal rounds between two bf16 subnormals the same way (bit patterns are monotone in |x|).

NOTE [ SR to bfloat16 is the formats' stochastic rounding ]: with u = r << 16 (a 32-bit
word), r < low iff u < low * 2^16 = floor(2^32 * low / 2^16), which is the rule of NOTE
[ Stochastic rounding with 32-bit words ] (reference/encode_kernels.py) for bfloat16, so
`reference.formats.encode(x, "bfloat16", rounding="stochastic", random_bits=r << 16)` gives
the same codes (claim optim.sr_bf16_formats).

NaN: the bit rule is not IEEE's on NaN (a NaN whose payload lies in the low 16 bits becomes
inf when it rounds down; 0xFFFFFFFF wraps to +0 in torchao's int32 arithmetic). The default,
`variant="ieee"`, gives a quiet NaN of x's sign (0x7FC0 | sign), as the formats' encoder
does; `variant="torchao"` is torchao's int32 arithmetic verbatim (held to torchao as a NaN
class: torch's bfloat16 cast writes its own NaN pattern).

The step, per bf16 parameter p with bf16 gradient g (torchao's `single_param_adam` under
`_AdamW(..., bf16_stochastic_round=True)`, torchao/optim/adam.py): every operation in
float32, one rounding each; the moments are STORED in p's dtype (bfloat16: torchao's
`zeros_like(p)`), rounded to nearest-even, while the float32 values just computed are the
ones the update uses:

    t <- t + 1                                  (float32 0-d, as torchao's state["step"])
    p32 = f32(p); g32 = f32(g); lr = f32(lr)     (torchao keeps lr as a float32 tensor)
    p32 = p32 - (lr * f32(wd)) * p32             decoupled weight decay
    c1 = 1 - f32(beta1)**t; c2 = 1 - f32(beta2)**t    float32 pow (tensor exponent)
    m32 = lerp(f32(m), g32, 1 - beta1); m <- bf16_rne(m32)
    v32 = lerp(f32(v), g32 * g32, 1 - beta2); v <- bf16_rne(v32)
    vmax32 = max(f32(vmax), v32); vmax <- bf16_rne(vmax32); v32 = vmax32      amsgrad
    denom = sqrt(v32) / sqrt(c2) + f32(eps)
    p32 = p32 - (lr * (m32 / c1)) / denom
    p <- round_bf16_stochastic(p32, r)

`lerp` is torch's with a scalar weight (reference/fma.py; one rounding per FMA, as both
torch's eager CPU kernel and the compiled step round it). `sqrt` is IEEE's (np.sqrt) unless
given another (NOTE [ torch's CPU sqrt is MKL's ] in reference/optim.py): torchao's step is
compiled by inductor, whose sqrt is IEEE's; torch_impl's eager twin uses MKL's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from reference.fma import lerp
from reference.formats import encode
from reference.optim import Optimizer

_BF16 = np.dtype(ml_dtypes.bfloat16)
VARIANTS = ("ieee", "torchao")

# NOTE [ SR draws are explicit ]
# The rounding takes its random bits as an argument: r, integers in [0, 2^16), one per
# element, as torchao draws them (`torch.randint(0, 1 << 16, x.shape, dtype=torch.int32)`).
# 16 bits are all the rule reads (bfloat16 drops 16 bits of float32); a 32-bit word u of the
# formats' encoder is r << 16. With the draws explicit, the two trees and torchao are fed the
# same bits and compared bit for bit; where they come from (a seeded generator, a hash of the
# step and the position) is the caller's, and a resumed run that replays them replays the run.


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _check_draws(x_shape: tuple[int, ...], x_dtype: object, draws_shape: tuple[int, ...],
                draws_dtype: object, low: int, high: int) -> None:
    """The argument checks both trees make, one line each (the bounds: the draws' min, max)."""
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
    """One line naming the variants."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def round_bf16_stochastic(x: np.ndarray, draws: np.ndarray, *, variant: str = "ieee"
                          ) -> np.ndarray:
    """float32 `x` rounded to bfloat16, away from zero iff draws < the 16 dropped bits.

    `draws`: integers in [0, 2^16), x's shape (NOTE [ SR draws are explicit ]). Returns an
    ml_dtypes.bfloat16 array. See the module docstring for the rule and the NaN variants.
    """
    x, draws = np.asarray(x), np.asarray(draws)
    _check_variant(variant)
    _check_draws(x.shape, x.dtype, draws.shape, draws.dtype,
                int(draws.min()) if draws.size else 0, int(draws.max()) if draws.size else 0)
    bits = x.view(np.uint32)
    low = bits & np.uint32(0xFFFF)
    kept = bits & np.uint32(0xFFFF0000)
    up = draws.astype(np.uint32) < low
    rounded = kept + (up.astype(np.uint32) << np.uint32(16))  # wraps mod 2^32, as int32 does
    codes = (rounded >> np.uint32(16)).astype(np.uint16)
    if variant == "ieee":
        sign = (bits >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
        codes = np.where(np.isnan(x), sign | np.uint16(0x7FC0), codes)
    return codes.view(_BF16)


def _f32(a: np.ndarray) -> np.ndarray:
    """A bfloat16 array widened to float32: its code in the upper 16 bits, exact."""
    return (a.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bf16_nearest(a: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest bfloat16, ties to even (torch's copy_ into bf16)."""
    return encode(a, "bfloat16").astype(np.uint16).view(_BF16)


class AdamWSR(Optimizer):
    """AdamW on bfloat16 parameters, the update rounded stochastically (torchao's _AdamW with
    bf16_stochastic_round=True). State: {"step" (float32 0-d), "exp_avg", "exp_avg_sq",
    "max_exp_avg_sq" if amsgrad}, the moments in bfloat16. `step(draws)` takes one draws
    array per parameter that has a gradient, in param_groups order."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 fma: bool = True,
                 sqrt: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> None:
        self._check_adam(lr, betas, eps)  # torchao's checks are torch's Adam's
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": amsgrad}
        super().__init__(params, defaults, fma)
        self.sqrt = sqrt  # NOTE [ torch's CPU sqrt is MKL's ] (reference/optim.py)

    def step(self, draws: Sequence[np.ndarray]) -> None:  # type: ignore[override]
        """One update of every parameter with a gradient, rounded with its draws."""
        todo = [(group, p) for group in self.param_groups for p in group["params"]
                if p.grad is not None]
        _check_step(len(todo), len(draws), [d for _, p in todo for d in (p.data.dtype,
                                                                            p.grad.dtype)])
        f32 = np.float32
        for (group, p), r in zip(todo, draws, strict=True):
            (beta1, beta2), wd = group["betas"], group["weight_decay"]
            state = self.state.setdefault(p, {})
            if not state:  # lazy initialization, as torchao
                state["step"] = np.array(0.0, dtype=np.float32)
                state["exp_avg"] = np.zeros_like(p.data)
                state["exp_avg_sq"] = np.zeros_like(p.data)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = np.zeros_like(p.data)
            state["step"] += f32(1)
            t = state["step"]
            p32, g32, lr = _f32(p.data), _f32(p.grad), f32(group["lr"])
            p32 = p32 - (lr * f32(wd)) * p32
            c1 = f32(1) - np.power(f32(beta1), t)
            c2 = f32(1) - np.power(f32(beta2), t)
            m32 = lerp(_f32(state["exp_avg"]), g32, f32(1 - beta1), self.fma)
            v32 = lerp(_f32(state["exp_avg_sq"]), g32 * g32, f32(1 - beta2), self.fma)
            state["exp_avg"], state["exp_avg_sq"] = _bf16_nearest(m32), _bf16_nearest(v32)
            if group["amsgrad"]:
                v32 = np.maximum(_f32(state["max_exp_avg_sq"]), v32)
                state["max_exp_avg_sq"] = _bf16_nearest(v32)
            denom = self.sqrt(v32) / self.sqrt(c2) + f32(group["eps"])
            p32 = p32 - (lr * (m32 / c1)) / denom
            np.copyto(p.data, round_bf16_stochastic(p32, r))


def _check_step(n_params: int, n_draws: int, dtypes: list[object]) -> None:
    """One line when the draws do not match the parameters, or a parameter or gradient is
    not bfloat16 (`dtypes`: each parameter's, then its gradient's)."""
    if n_draws != n_params:
        raise ValueError(f"AdamWSR.step: {n_draws} draws for {n_params} parameters with "
                         "gradients")
    for dtype in dtypes:
        if _dtype_name(dtype) != "bfloat16":
            raise TypeError(f"AdamWSR: parameters and gradients must be bfloat16, got "
                            f"{_dtype_name(dtype)}")
