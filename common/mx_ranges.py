"""The declared range of every argument of the MX twins' public functions (reference/mx.py,
torch_impl/mx.py), in one place, read by both trees' argument checks, by the strategies
(parity/strategies/mx.py) and by the edge test (parity/test_mx_edges.py), which drives every
public function at each edge of each range and one step past it.

An enumeration is a tuple of names (its first member the default where the function has
one); an integer range is a `range` (both edges r[0] and r[-1] accepted); an amax or a scale
is a float in [0, inf], NaN accepted (it propagates as the libraries' own max does).

Each MX variant takes a subset of the scale modes and roundings: the library it names has
only those (microxcaling's shared exponent is floor(log2 amax), its default rounding ties
away; Transformer Engine's MXFP8 scale is rceil, its cast to nearest even, its element
formats the two fp8 ones). A variant *sets* its mode and rounding when the caller leaves
them out (None) and *refuses* a contradicting one with one line: `variant_settings`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ELEMENT_FORMATS: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn",
                                    "float6_e3m2fn", "float4_e2m1fn")
SCALE_MODES: tuple[str, ...] = ("floor", "ceil", "even", "rceil", "rceil_log2f")
ROUNDINGS: tuple[str, ...] = ("nearest_even", "nearest_away")
# the specification (default), torchao 0.18's to_mx, microxcaling v1.1.0's default (Python)
# path and its C++ path, Transformer Engine's MXFP8 (reference/mx_variants.py)
VARIANTS: tuple[str, ...] = ("ocp", "torchao", "microxcaling", "microxcaling_cpp",
                             "transformer_engine")
NVFP4_VARIANTS: tuple[str, ...] = ("transformer_engine", "torchao")
# a block size: any positive int (a block longer than the last dimension is refused by the
# shape check, not here); torch's sizes are int64
BLOCK_SIZES = range(1, 2**63)


@dataclass(frozen=True)
class VariantRange:
    """What one MX variant takes: its scale modes, roundings and element formats, each
    tuple's first member the one it sets when the caller passes None."""

    modes: tuple[str, ...]
    roundings: tuple[str, ...]
    formats: tuple[str, ...]
    why: str  # one line: where the restriction comes from


_EVERY = (SCALE_MODES, ROUNDINGS, ELEMENT_FORMATS)
VARIANT_RANGES: dict[str, VariantRange] = {
    "ocp": VariantRange(*_EVERY, "every mode and rounding over the specification's scale"),
    "torchao": VariantRange(*_EVERY, "every mode and rounding, torchao's divisors"),
    "microxcaling": VariantRange(("floor",), ("nearest_away",), ELEMENT_FORMATS,
                                 "its shared exponent is floor(log2 amax), its rounding "
                                 "round='nearest' (ties away)"),
    "microxcaling_cpp": VariantRange(("floor",), ("nearest_away",), ELEMENT_FORMATS,
                                     "its shared exponent is amax's exponent field, its "
                                     "rounding rd_away (ties away)"),
    "transformer_engine": VariantRange(("rceil",), ("nearest_even",),
                                       ("float8_e4m3fn", "float8_e5m2"),
                                       "MXFP8: an rceil scale, cvt.rn.satfinite elements"),
}


def _known(what: str, value: object, members: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in members:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(members)}")


def check_variant(variant: object) -> str:
    """`variant` when it is one of VARIANTS, else one ValueError line listing them."""
    _known("MX variant", variant, VARIANTS)
    return str(variant)


def variant_settings(variant: object, fmt: object, mode: object, rounding: object
                     ) -> tuple[str, str]:
    """(mode, rounding) for `variant`: None takes the variant's own; a name outside the
    declared enumerations is refused first (as unknown), then one the variant does not take
    (as contradicting it), each in one ValueError line."""
    _known("MX element format", fmt, ELEMENT_FORMATS)
    if mode is not None:
        _known("scale mode", mode, SCALE_MODES)
    if rounding is not None:
        _known("rounding", rounding, ROUNDINGS)
    allowed = VARIANT_RANGES[check_variant(variant)]
    for name, value, members in (("element format", fmt, allowed.formats),
                                 ("scale mode", mode, allowed.modes),
                                 ("rounding", rounding, allowed.roundings)):
        if value is not None and value not in members:
            raise ValueError(f"the {variant} variant takes {name} "
                             f"{' or '.join(map(repr, members))} only ({allowed.why}), "
                             f"got {value!r}")
    return (allowed.modes[0] if mode is None else str(mode),
            allowed.roundings[0] if rounding is None else str(rounding))


def check_block_size(block_size: object) -> int:
    """`block_size` when it is an int in BLOCK_SIZES (not a bool), else one ValueError line."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) \
            or block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


def check_amax(name: str, value: object) -> float:
    """An amax or a scale (global_amax, per_tensor) as a float: a real number (a Python or
    NumPy scalar, a 0-d array; the torch tree passes a 0-d tensor's item) in [0, inf] or
    NaN, else one line: TypeError for another type, ValueError below 0."""
    if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, (int, float, np.integer, np.floating))
            or (isinstance(value, np.ndarray) and value.ndim == 0
                and value.dtype.kind in "iuf")):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0 (an amax or a scale), got {v!r}")
    return v


def check_nvfp4(variant: object, per_tensor: object, global_amax: object) -> None:
    """NVFP4's variant and its own level argument (per_tensor: torchao's g, global_amax: TE's
    A; each None or an amax by check_amax), else one line."""
    if not isinstance(variant, str) or variant not in NVFP4_VARIANTS:
        raise ValueError(f"unknown NVFP4 variant {variant!r}; known: {', '.join(NVFP4_VARIANTS)}")
    if (per_tensor, global_amax)[variant == "torchao"] is not None:  # the other variant's
        raise ValueError("per_tensor is torchao's g, global_amax Transformer Engine's A: "
                         f"the {variant} variant takes only its own")
    for name, value in (("per_tensor", per_tensor), ("global_amax", global_amax)):
        if value is not None:
            check_amax(name, value)
