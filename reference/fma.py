"""Fused multiply-add, correctly rounded, in NumPy: the rounding of torch's CPU optimizer kernels.

    fma(a, b, c)     = RN(a * b + c)           one rounding (fused=False: RN(RN(a * b) + c))
    lerp(s, e, w)    = fma(w, e - s, s)        if |w| < 0.5
                     = fma(w - 1, e - s, e)    otherwise (torch's two branches, exact at w = 1)

RN rounds to nearest-even in the operands' dtype (float32 or float64). NumPy has no fma
(math.fma needs Python 3.13), so `fma` builds the single rounding from exact pieces: NOTE
[ Exact FMA emulation ]. Why the optimizers need it: NOTE [ FMA in torch's CPU kernels ].
torch has no twin of this file: the fused rounding is inside its kernels (torch.add(alpha=),
addcmul, lerp), which parity/test_optim.py compares against this bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# NOTE [ FMA in torch's CPU kernels ]
# torch's CPU kernels for add(alpha=), addcmul, lerp (and SGD/Adam are built from them) are
# written `self + alpha * other`. The vectorized body calls vec::fmadd, a hardware fused
# multiply-add on the AVX2 and AVX512 builds; the scalar tail (n mod 2*vector width
# elements, and 0-d tensors) is plain C++ that GCC contracts to an FMA too (GNU mode,
# -ffp-contract=fast). So with capability AVX512 or AVX2 every element is fma(a, b, c), in
# the body and in the tail, whatever the size or the thread split; with
# ATEN_CPU_CAPABILITY=default no element is fused (two roundings everywhere). addcdiv
# `self + value * t1 / t2` ends in a division, so there is nothing to fuse and NumPy's
# three roundings match. docs/optim.md gives the sizes measured and how often unfused NumPy
# differs from the fused kernels.


def _add_round_to_odd(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y rounded to odd: exact sums as is, inexact ones to the neighbour with odd last bit.

    TwoSum (Knuth) gives the exact error e = (x + y) - s of s = fl(x + y); when e != 0 the
    exact sum lies strictly between s and its neighbour toward e, and round-to-odd picks
    whichever of the two has an odd significand.
    """
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    uint = np.uint64 if s.dtype == np.float64 else np.uint32
    even = (np.asarray(s).view(uint) & uint(1)) == 0
    push = (e != 0) & even & np.isfinite(s)
    return np.where(push, np.nextafter(s, np.where(e > 0, np.inf, -np.inf).astype(s.dtype)), s)


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Veltkamp splitting: a = hi + lo exactly, each with at most 26 significant bits."""
    t = a * 134217729.0  # 2**27 + 1
    hi = t - (t - a)
    return hi, a - hi


# NOTE [ Exact FMA emulation ]
# float32: the product of two float32 (24 + 24 = 48 significant bits) is exact in float64
# (53 bits). The sum p + c rounded to float64 and then to float32 is a DOUBLE rounding that
# can go wrong: Figueroa's q >= 2p + 2 guarantee covers one operation on p-bit operands,
# not a 48-bit product plus a 24-bit addend. Counterexample: a = 2**-12 (1 + 2**-23),
# b = 2**-12 (1 - 2**-23), c = 1 + 2**-23; a*b + c = 1 + 2**-23 + 2**-24 - 2**-70 rounds to
# float64 as the exact float32 midpoint 1 + 2**-23 + 2**-24, which ties to even upward,
# while the true sum rounds down to c. Rounding the float64 sum to ODD instead (TwoSum
# error, then push an inexact even result one ulp toward the error) keeps the sticky
# information, and a round-to-odd result with >= p + 2 bits rounds correctly to p bits
# (Boldo and Melquiond 2008): 53 >= 24 + 2.
# float64: no wider type holds the product (np.longdouble is x87 80-bit here: 64 bits <
# 106), so use error-free transformations: a*b = uh + ul exactly (Dekker's TwoProduct with
# Veltkamp splitting), c + uh = th + tl exactly (TwoSum), then fma = RN(th + RO(tl + ul))
# (Boldo and Melquiond 2008, Algorithm 5.4). Exact while nothing overflows and the product
# does not underflow: |a|, |b| < 2**995 and |a*b| >= 2**-969 (or a*b == 0). Non-finite
# operands fall back to a * b + c, which gives the same inf/NaN as the hardware FMA.


def fma(a: Any, b: Any, c: Any, fused: bool = True) -> np.ndarray:
    """a * b + c rounded once to nearest-even in the operands' dtype (float32 or float64).

    With `fused=False`: a * b rounded, then + c rounded (the unfused kernels' rounding).
    """
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    dtype = a.dtype
    if b.dtype != dtype or c.dtype != dtype or dtype not in (np.float32, np.float64):
        raise TypeError(f"fma: operands must share dtype float32 or float64, got "
                        f"{a.dtype}, {b.dtype}, {c.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        if not fused:
            return np.asarray(a * b + c)
        if dtype == np.float32:
            wide = _add_round_to_odd(a.astype(np.float64) * b.astype(np.float64),
                                     c.astype(np.float64))
            return np.asarray(wide.astype(np.float32))
        uh = a * b
        (ah, al), (bh, bl) = _split(a), _split(b)
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th = c + uh
        bb = th - c
        tl = (c - (th - bb)) + (uh - bb)
        exact = th + _add_round_to_odd(tl, ul)
        naive = uh + c
        return np.asarray(np.where(np.isfinite(naive), exact, naive))


def lerp(start: np.ndarray, end: np.ndarray, weight: np.floating, fused: bool = True
         ) -> np.ndarray:
    """torch.lerp with a scalar weight: start + weight * (end - start), torch's two branches.

    For |weight| >= 0.5 torch anchors at `end` (end - (end - start) * (1 - weight)), which is
    exact at weight = 1; the fused form is fma(weight - 1, end - start, end).
    """
    diff = end - start
    if abs(weight) < 0.5:
        return fma(weight, diff, start, fused)
    return fma(weight - weight.dtype.type(1), diff, end, fused)
