"""The pack step of encode's fast path (reference/encode_kernels.py): |code| -> code, the
overflow policy, NaN and the sign, convention by convention, in the block's working arrays
(`Scratch`, `out=` and in-place operators: NOTE [ NumPy's fast forms ] there). The readable
statement of the same step is reference/small_formats.py's `pack`; tests/test_encode_fast.py
holds the two bit-equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# `plan` and `s` are encode_kernels' Plan and Scratch, typed Any here: encode_kernels imports
# this module, and an import back (even for the hints) would make a cycle
Plan = Scratch = Any

__all__ = ["pack", "pack_finite", "pack_fnuz"]


def pack(kept: np.ndarray, plan: Plan, subnormals: bool, s: Scratch) -> np.ndarray:
    """The code: kept is |code| already; apply the overflow policy, NaN, and the sign
    (reference/small_formats.py: pack, convention by convention)."""
    code, fmt = kept, plan.fmt  # code: updated in place from here on
    if fmt.convention == "fnuz":
        return pack_fnuz(kept, plan, subnormals, s)
    if fmt.convention == "finite":
        return pack_finite(kept, plan, subnormals, s)
    if not subnormals:
        code[code < (1 << fmt.mantissa_bits)] = 0
    # Overflow (+-inf lands here too): every code above max becomes the policy's code. When
    # that code is max or the one right above it, this is a minimum (cheaper than a select).
    if plan.overflows and plan.replacement <= fmt.max_code + 1:
        np.minimum(code, s.limit, out=code)
    elif plan.overflows:
        code[code > fmt.max_code] = plan.replacement
    # NaN stays NaN, the quiet NaN with the input's sign (payloads are not carried).
    if s.nan.any():
        code[s.nan] = fmt.nan_code
    sign = s.sign
    sign <<= plan.code_sign
    code |= sign
    return code


def pack_fnuz(kept: np.ndarray, plan: Plan, subnormals: bool, s: Scratch) -> np.ndarray:
    """pack for a fnuz format: the one NaN is the sign bit alone, and no zero is negative.

    After the overflow's minimum, |code| <= max_code + 1 = 2^(bits-1), which under "nan" is
    the NaN itself; the sign goes on every nonzero code, and (code + 2^bits - 1) >> bits is
    1 exactly for those (code < 2^bits), so one carry masks the sign of a zero off. The
    NaN's code already holds the sign bit, so its sign changes nothing."""
    code, fmt = kept, plan.fmt
    if not subnormals:
        code[code < (1 << fmt.mantissa_bits)] = 0
    np.minimum(code, s.limit, out=code)  # beyond max: max, or the NaN (max_code + 1)
    if s.nan.any():
        code[s.nan] = fmt.max_code + 1
    nonzero = np.add(code, plan.code_ones, out=s.odd)
    nonzero >>= plan.code_bits  # 1 where code != 0
    sign = s.sign
    sign &= nonzero  # no -0
    sign <<= plan.code_sign
    code |= sign
    return code


def pack_finite(kept: np.ndarray, plan: Plan, subnormals: bool, s: Scratch) -> np.ndarray:
    """pack for a finite format (no NaN, no inf): every code beyond max saturates (+-inf
    too), and a NaN gives a zero of the opposite sign (NOTE [ NaN to a finite format ] in
    reference/small_formats.py)."""
    code, fmt = kept, plan.fmt
    if not subnormals:
        code[code < (1 << fmt.mantissa_bits)] = 0
    np.minimum(code, s.limit, out=code)
    sign = s.sign
    if s.nan.any():
        code[s.nan] = 0
        sign[s.nan] ^= plan.one
    sign <<= plan.code_sign
    code |= sign
    return code
