"""Plain data of the per-tensor fp8 scaling recipes, shared by reference/fp8_scaling.py and
torch_impl/fp8_scaling.py (the math: reference/fp8_scaling.py's docstring).

The recipe formats are Transformer Engine's `recipe.Format`: E4M3 casts forward and
backward tensors to float8_e4m3fn; HYBRID (TE's default) casts forward tensors (activations,
weights) to float8_e4m3fn and backward ones (gradients) to float8_e5m2, which has the range
gradients need (max 57344, smallest subnormal 2^-16) at one bit less precision.
"""

from __future__ import annotations

FP8_FORMATS: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")

# recipe format -> (forward format, backward format)
RECIPE_FORMATS: dict[str, tuple[str, str]] = {
    "E4M3": ("float8_e4m3fn", "float8_e4m3fn"),
    "HYBRID": ("float8_e4m3fn", "float8_e5m2"),
}

AMAX_ALGOS: tuple[str, ...] = ("max", "most_recent")

# the scale's formula in delayed scaling: TE's CUDA kernel or its unfused Python update
# (reference/fp8_scaling.py, NOTE [ The margin's two orders ])
DELAYED_ORDERS: tuple[str, ...] = ("kernel", "python")

# an amax history's length: one slot or more (TE's default 1024; no upper bound but memory)
HISTORY_LENGTHS = range(1, 2**63)

# the margin's declared range, read by the argument check and by the strategies that draw it
# (parity/strategies/fp8_scaling.py), so the tests reach both edges: in it, fp8_max * 2^-margin
# is a normal float32 for both formats (448 * 2^-100 and 57344 * 2^-100 are above 2^-126)
MARGINS = range(-100, 101)

# torchao.float8.float8_utils.EPS: the floor under an amax before the division (a float64)
AMAX_EPS = 1e-12


def recipe_format(recipe: str, forward: bool) -> str:
    """The fp8 format a recipe format ("E4M3", "HYBRID") casts a forward or backward tensor to."""
    if recipe not in RECIPE_FORMATS:
        raise ValueError(f"recipe_format: recipe must be one of {tuple(RECIPE_FORMATS)}, "
                         f"got {recipe!r}")
    return RECIPE_FORMATS[recipe][0 if forward else 1]


def check_fp8_format(fmt: str, where: str) -> str:
    """`fmt` when it is one of FP8_FORMATS, else ValueError naming `where`."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"{where}: fmt must be one of {FP8_FORMATS}, got {fmt!r}")
    return fmt


def check_delayed_args(margin: int, algo: str, where: str) -> None:
    """ValueError/TypeError for a margin that is not an int in [-100, 100] (there fp8_max *
    2^-margin is a normal float32 for both formats, so the scaled max is exact) or an algo not
    in AMAX_ALGOS."""
    if isinstance(margin, bool) or not isinstance(margin, int):
        raise TypeError(f"{where}: margin must be an int, got {type(margin).__name__}")
    if margin not in MARGINS:
        raise ValueError(f"{where}: margin must be in [{MARGINS[0]}, {MARGINS[-1]}], got "
                         f"{margin}")
    if algo not in AMAX_ALGOS:
        raise ValueError(f"{where}: algo must be one of {AMAX_ALGOS}, got {algo!r}")


def check_order(order: str, where: str) -> None:
    """ValueError for an order not in DELAYED_ORDERS."""
    if order not in DELAYED_ORDERS:
        raise ValueError(f"{where}: order must be 'kernel' or 'python', got {order!r}")
