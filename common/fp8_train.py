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
    fp8-blockwise-  one float32 scale per tile: x, g    e4m3      e4m3       te: yes
      deepseek,     1x128 along K (128x1 where K is                          deepseek,
      torchao, te   the rows), W 128x128; the variant's                      torchao: no
                    rule (reference/fp8_blockwise.py)
    nvfp4           two-level: e4m3 per 16 (x, g: 1x16  e2m1      e2m1       (e4m3 and a
                    along K; W: 16x16) and the tensor's                      float32 amax)
                    float32 amax (reference/nvfp4.py)
    bf16-sr         no scaled GEMM: bfloat16 weights, AdamWSR (reference/recipes_train.py)

Blockwise tiles longer than the matrix are cut to it (fp8_blockwise._within): the compact
GPT's widths are 32 and 128, so a 1x128 tile of a 32-wide activation is its whole row.
nvfp4 is Transformer Engine's NVFP4BlockScaling: the two operands of grad_weight (K = N)
go through the random Hadamard transform first (their bfloat16 values, 16 along N at a
time: the RHT's output is rounded to bfloat16, as TE's kernel rounds it), the gradient g is
rounded stochastically in both backward GEMMs (its random bits from the run's BitStream,
common/recipes_train.py), everything else to nearest even. Since M M^T = I per group of 16,
q(M^T g)^T q(M^T x) estimates g^T x.

fp8-tensorwise is torchao's "tensorwise" recipe (the HYBRID formats), fp8-rowwise its
"rowwise" recipe (e4m3 everywhere, round_scales_to_power_of_2=True), fp8-delayed the
HYBRID recipe of Transformer Engine's DelayedScaling (margin 0, amax_compute_algo "max"),
fp8-blockwise-* DeepSeek-V3's fine-grained recipe (arXiv:2412.19437, 3.3.2) with the scale
rule of DeepGEMM, torchao 0.18's blockwise_fp8_training or TE's Float8BlockScaling.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALED_PRECISIONS: tuple[str, ...] = ("fp8-tensorwise", "fp8-rowwise", "fp8-delayed", "mxfp8",
                                      "mxfp4", "fp8-blockwise-deepseek", "fp8-blockwise-torchao",
                                      "fp8-blockwise-te", "nvfp4")
# precisions of the weights, not of the GEMMs: bf16-sr trains bfloat16 weights with AdamWSR
WEIGHT_PRECISIONS: tuple[str, ...] = ("bf16-sr",)
GEMMS: tuple[str, ...] = ("output", "grad_input", "grad_weight")
# the delayed-scaling state of one layer: an amax history and a scale per scaled tensor
DELAYED_TENSORS: tuple[str, ...] = ("input", "weight", "grad_output")


@dataclass(frozen=True)
class Recipe:
    """How a scaled precision casts: `kind` "fp8" (per tensor or per row), "mx" (blocks),
    "blockwise" (tiles) or "nvfp4" (two-level tiles); the forward (x, W) and backward (g)
    element formats; rowwise; power-of-2 scales; delayed scaling's history length and margin
    (history 0: current scaling); MX's scale mode; blockwise's variant and its tile of x and
    g (along K; transposed where K is the rows) and of W; nvfp4's tiles, the RHT on the
    grad_weight operands and stochastic rounding of g."""

    name: str
    kind: str
    forward: str
    backward: str
    rowwise: bool = False
    power_of_2: bool = False
    history: int = 0
    margin: int = 0
    mx_mode: str = "floor"
    variant: str = ""
    tile: tuple[int, int] = (1, 128)
    weight_tile: tuple[int, int] = (128, 128)
    wgrad_rht: bool = False
    grad_stochastic: bool = False

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
    **{f"fp8-blockwise-{short}": Recipe(f"fp8-blockwise-{short}", "blockwise", "float8_e4m3fn",
                                        "float8_e4m3fn", power_of_2=short == "te",
                                        variant=variant)
       for short, variant in (("deepseek", "deepseek"), ("torchao", "torchao"),
                              ("te", "transformer_engine"))},
    "nvfp4": Recipe("nvfp4", "nvfp4", "float4_e2m1fn", "float4_e2m1fn", tile=(1, 16),
                    weight_tile=(16, 16), wgrad_rht=True, grad_stochastic=True),
}
GPT_PRECISIONS: tuple[str, ...] = (*SCALED_PRECISIONS, *WEIGHT_PRECISIONS)  # --model gpt only


def recipe(precision: str) -> Recipe:
    """The recipe of a scaled precision (ValueError naming the accepted ones)."""
    if precision not in RECIPES:
        raise ValueError(f"fp8_train: precision must be one of {SCALED_PRECISIONS}, "
                         f"got {precision!r}")
    return RECIPES[precision]


def autocast_precision(precision: str) -> str:
    """The autocast precision a run of `precision` steps under: a scaled precision runs
    everything but its scaled GEMMs in float32 ("fp32": no autocast, no loss scale); so does
    bf16-sr, on weights that hold bfloat16 values."""
    return "fp32" if precision in GPT_PRECISIONS else precision


def needs_bits(precision: str) -> bool:
    """Whether a run of `precision` draws random bits (common/recipes_train.BitStream): nvfp4's
    stochastic rounding of gradients, bf16-sr's of the weights."""
    return precision in WEIGHT_PRECISIONS or (precision in RECIPES
                                              and RECIPES[precision].grad_stochastic)
