"""Plain data of training in fp8 and MX: the five scaled precisions and what each casts, shared
by reference/fp8_train.py and torch_impl/fp8_train.py (the math: reference/fp8_train.py).

A scaled linear layer y = x W^T + b runs its three GEMMs on quantize-dequantized operands,
each cast on its own (torchao's Float8Linear: float8/float8_linear.py's
matmul_with_hp_or_float8_args; the master weights stay float32):

    GEMM         product                     operand scaled along   format (fp8 recipes)
    output       y = q(x) @ q(W)^T           x: its rows (K = in)   forward (e4m3)
                                             W: its rows (K = in)   forward (e4m3)
    grad_input   dx = q(g) @ q(W)            g: its rows (K = out)  backward
                                             W: its columns (out)   forward
    grad_weight  dW = q(g)^T @ q(x)          g: its columns (N)     backward
                                             x: its columns (N)     forward

Every operand is scaled along the GEMM's inner dimension K (rowwise: one scale per row of
the left operand's K-vectors; MX: blocks of 32 along K), so the scales factor out of each dot
product. Tensorwise and delayed scaling use one scale per tensor.

    precision       scales                              forward   backward   power of 2
    fp8-tensorwise  current, per tensor                 e4m3      e5m2       no
    fp8-rowwise     current, per row along K            e4m3      e4m3       yes
    fp8-delayed     TE's amax history (length 16)       e4m3      e5m2       no
    mxfp8           MX floor scales, blocks of 32       e4m3      e4m3       (e8m0)
    mxfp4           MX floor scales, blocks of 32       e2m1      e2m1       (e8m0)

fp8-tensorwise is torchao's "tensorwise" recipe (the HYBRID formats), fp8-rowwise its
"rowwise" recipe (e4m3 everywhere, round_scales_to_power_of_2=True), fp8-delayed the
HYBRID recipe of Transformer Engine's DelayedScaling (margin 0, amax_compute_algo "max").
"""

from __future__ import annotations

from dataclasses import dataclass

SCALED_PRECISIONS: tuple[str, ...] = ("fp8-tensorwise", "fp8-rowwise", "fp8-delayed", "mxfp8",
                                      "mxfp4")
GEMMS: tuple[str, ...] = ("output", "grad_input", "grad_weight")
# the delayed-scaling state of one layer: an amax history and a scale per scaled tensor
DELAYED_TENSORS: tuple[str, ...] = ("input", "weight", "grad_output")


@dataclass(frozen=True)
class Recipe:
    """How a scaled precision casts: `kind` "fp8" (per tensor or per row) or "mx" (blocks);
    the forward (x, W) and backward (g) element formats; rowwise; power-of-2 scales;
    delayed scaling's history length and margin (history 0: current scaling); MX's scale
    mode."""

    name: str
    kind: str
    forward: str
    backward: str
    rowwise: bool = False
    power_of_2: bool = False
    history: int = 0
    margin: int = 0
    mx_mode: str = "floor"

    @property
    def delayed(self) -> bool:
        return self.history > 0


RECIPES: dict[str, Recipe] = {
    "fp8-tensorwise": Recipe("fp8-tensorwise", "fp8", "float8_e4m3fn", "float8_e5m2"),
    "fp8-rowwise": Recipe("fp8-rowwise", "fp8", "float8_e4m3fn", "float8_e4m3fn",
                          rowwise=True, power_of_2=True),
    "fp8-delayed": Recipe("fp8-delayed", "fp8", "float8_e4m3fn", "float8_e5m2", history=16),
    "mxfp8": Recipe("mxfp8", "mx", "float8_e4m3fn", "float8_e4m3fn"),
    "mxfp4": Recipe("mxfp4", "mx", "float4_e2m1fn", "float4_e2m1fn"),
}


def recipe(precision: str) -> Recipe:
    """The recipe of a scaled precision (ValueError naming the accepted ones)."""
    if precision not in RECIPES:
        raise ValueError(f"fp8_train: precision must be one of {SCALED_PRECISIONS}, "
                         f"got {precision!r}")
    return RECIPES[precision]


def autocast_precision(precision: str) -> str:
    """The autocast precision a run of `precision` steps under: a scaled precision runs
    everything but its scaled GEMMs in float32 ("fp32": no autocast, no loss scale)."""
    return "fp32" if precision in RECIPES else precision
