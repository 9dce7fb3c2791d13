"""The rounding behind reference.formats.encode, on one block of source words.

reference/formats.py states the math (the module docstring: W, shift, kept, nearest-even in
one carry) and runs these three steps block by block (NOTE [ Encoding in blocks ]):

    decompose   word -> (W, shift)      |x| placed in the target's binades
    round       (W, shift) -> kept      drop `shift` bits by the rounding rule
    pack        kept -> code            overflow policy, NaN, sign

Every step writes into the block's working arrays (`Scratch`) with `out=` or an in-place
operator: no NumPy temporary is allocated per operation. Which form an operation takes is
chosen by what NumPy vectorizes (NOTE [ NumPy's fast forms ]); the arithmetic is the same.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from reference.format_spec import FloatFormat

__all__ = ["Scratch", "decompose", "pack", "round_dropped_bits"]

# NOTE [ NumPy's fast forms ]
# NumPy 2's SIMD loops cover an array combined with a scalar, or two contiguous arrays, for
# add, subtract, the shifts and the bitwise operators, and an in-place operator (`w += 1`)
# touches one array instead of three. They do not cover np.minimum/np.maximum against a
# scalar: that runs element by element, about 5x slower than against an array (measured
# 0.5 against 0.1 ns per element on a cached block of 2^16 uint32). So the overflow policy's
# minimum is taken against `Scratch.limit`, an array holding the policy's code, and the
# binade's against `Scratch.lowest`. A comparison yields bool, and turning bool into a
# number is a cast that costs 2.5 times a pass; the NaN mask is computed in the integers
# instead ((inf - |word|) >> (bits - 1) is 1 exactly where |word| > inf: the subtraction
# wraps around).


class Scratch(NamedTuple):
    """encode's working arrays, one block long, named for what they first hold; the last
    two hold constants, refilled when the format or the policy changes (NOTE [ NumPy's
    fast forms ])."""

    magnitude: np.ndarray  # |word|, then W, then kept, then the code
    shift: np.ndarray  # the source's binade, then the shift
    odd: np.ndarray  # the lowest kept bit
    carry: np.ndarray  # what rounding adds
    sign: np.ndarray  # the sign bit, then the code's sign
    nan: np.ndarray  # 1 where the input is a NaN, then the NaN code there
    limit: np.ndarray  # the overflow policy's code
    lowest: np.ndarray  # the target's lowest binade, as a source exponent

    @classmethod
    def for_thread(cls, n: int, src: FloatFormat, fmt: FloatFormat, overflow: str) -> Scratch:
        """The calling thread's arrays for blocks of n elements from `src`, kept from call to
        call (NOTE [ Encoding in blocks ]), their constants filled for (fmt, overflow)."""
        pool = _POOL.__dict__.setdefault("arrays", {})
        key = (src.bits, n)
        if key not in pool:
            uint = np.uint32 if src.bits == 32 else np.uint64
            pool[key] = _Pooled(cls(*(np.empty(n, dtype=uint) for _ in cls._fields)))
        pooled = pool[key]
        if pooled.filled_for != (fmt, overflow):
            pooled.scratch.limit.fill(replacement_code(fmt, overflow))
            pooled.scratch.lowest.fill(lowest_binade(src, fmt))
            pooled.filled_for = (fmt, overflow)
        return pooled.scratch

    def first(self, n: int) -> Scratch:
        """The first n elements of every array (views; the last one made is kept: a caller
        encoding arrays of one size again and again slices once)."""
        if n == self.magnitude.size:
            return self
        last = _POOL.__dict__.get("last_view")
        if last is None or last.magnitude.base is not self.magnitude or last.magnitude.size != n:
            last = _POOL.last_view = Scratch(*(a[:n] for a in self))
        return last


class _Pooled:
    """A thread's Scratch and the (format, policy) its constants hold."""

    def __init__(self, scratch: Scratch) -> None:
        self.scratch, self.filled_for = scratch, None


_POOL = threading.local()  # each thread's Scratch arrays, by (source width, block length)


def lowest_binade(src: FloatFormat, fmt: FloatFormat) -> int:
    """The target's lowest binade 1 - b, as a biased exponent of the source."""
    return fmt.min_exponent + src.bias


def replacement_code(fmt: FloatFormat, overflow: str) -> int:
    """The code (sign cleared) a result beyond fmt.max becomes under the overflow policy."""
    if overflow == "inf":
        return fmt.inf_code  # type: ignore[return-value]  (None only where refused earlier)
    return fmt.max_code if overflow == "saturate" else fmt.nan_code


def decompose(word: np.ndarray, src: FloatFormat, fmt: FloatFormat, s: Scratch
              ) -> tuple[np.ndarray, object]:
    """(W, shift) of each source word: x = (-1)^sign * M * 2^q, placed in the target's
    binades as W = ((t - (1 - b)) << (m + shift)) + M. The sign bit goes to `s.sign`, and
    `s.nan` is 1 where x is a NaN (|word| above the infinity's), else 0.

    In the source's biased exponents, M * 2^q has q = max(E, 1) - bias - m_src and the
    target binade is t = max(E, lowest), `lowest` being the target's 1 - b. So
    shift = t - m - q = lowest - min(max(E, 1), lowest) + (m_src - m), and W is the magnitude
    less the binades below min(max(E, 1), lowest). Everything is unsigned.

    Here lowest > 1 (lowest = 1 takes the scalar shift), and then min(E, lowest) serves for
    min(max(E, 1), lowest): only E = 0, a source subnormal, tells them apart, and it lies
    too far below the target to matter. lowest > 1 means fewer exponent bits than the source
    (from float32, 7 or fewer: lowest >= 65; from float64, 10 or fewer: lowest >= 513), so
    a source subnormal's shift, lowest + (m_src - m), exceeds 64, the word's width: it
    rounds to 0 whatever W holds (W wraps around for E = 0).
    """
    np.right_shift(word, src.bits - 1, out=s.sign)
    magnitude = np.bitwise_and(word, 2 ** (src.bits - 1) - 1, out=s.magnitude)
    nan = np.subtract(src.inf_code, magnitude, out=s.nan)  # wraps around where |x| > inf
    nan >>= src.bits - 1
    lowest = lowest_binade(src, fmt)
    drop = src.mantissa_bits - fmt.mantissa_bits
    if lowest == 1:  # the target has every binade of the source: one shift for all (bf16)
        return magnitude, word.dtype.type(drop)
    binade = np.right_shift(magnitude, src.mantissa_bits, out=s.shift)
    np.minimum(binade, s.lowest, out=binade)  # min(E, lowest): see above for E = 0
    below = np.subtract(binade, 1, out=s.carry)
    below <<= src.mantissa_bits  # (binade - 1) << m_src
    w = magnitude
    w -= below
    shift = np.subtract(lowest + drop, binade, out=binade)
    return w, shift


def round_dropped_bits(w: np.ndarray, shift: object, rounding: str, u: np.ndarray | None,
                       s: Scratch) -> np.ndarray:
    """kept: W with `shift` bits dropped by the rounding rule (reference/formats.py), in W's
    array.

    Shifts past the word's width give 0 in NumPy (all bits dropped), which is what rounding
    a value far below half the smallest subnormal needs."""
    uint = w.dtype.type
    if rounding == "nearest_even":
        # W + half - 1 + odd carries past the dropped bits exactly when rest > half, or
        # rest == half and kept is odd.
        if np.ndim(shift) == 0 and shift == 0:
            return w  # nothing dropped (a target as precise as the source): W is kept
        odd = np.right_shift(w, shift, out=s.odd)  # (W >> shift) & 1
        odd &= 1
        if np.ndim(shift) == 0:  # one shift for every element: half - 1 is a number
            w += odd
            w += (1 << int(shift) >> 1) - 1
        else:  # half - 1 + odd, written ((1 << shift) - 1 + odd) >> 1 for shift = 0 too
            carry = np.left_shift(1, shift, out=s.carry)
            carry -= 1
            carry += odd
            carry >>= 1
            w += carry
    elif rounding == "stochastic":
        # NOTE [ Stochastic rounding with 32-bit words ]: round up when u is below the top 32
        # dropped bits, read as a fraction of the spacing: probability floor(2^32 p) / 2^32
        # for p = rest / 2^shift, which is exactly p when shift <= 32. With more dropped bits
        # (results deep in the subnormals, or float64 input) p is truncated to 32 bits, a
        # bias below 2^-32 of the spacing. (This branch allocates its uint64 words.)
        shift64 = np.asarray(shift, dtype=np.uint64)
        rest = (w - ((w >> shift) << shift)).astype(np.uint64)
        top32 = np.where(shift64 <= 32, rest << (np.uint64(32) - np.minimum(shift64, 32)),
                         rest >> (np.maximum(shift64, 32) - np.uint64(32)))
        w >>= shift
        w += (u < top32).astype(uint)
        return w
    w >>= shift  # toward_zero drops the bits; nearest_even has carried into the kept ones
    return w


def pack(kept: np.ndarray, fmt: FloatFormat, overflow: str, subnormals: bool, s: Scratch
         ) -> np.ndarray:
    """The code: kept is |code| already; apply the overflow policy, NaN, and the sign."""
    code = kept  # updated in place from here on
    if not subnormals:
        code[code < (1 << fmt.mantissa_bits)] = 0
    # Overflow (+-inf lands here too): every code above max becomes the policy's code. When
    # that code is max or the one right above it, this is a minimum (cheaper than a select).
    replacement = replacement_code(fmt, overflow)
    if replacement <= fmt.max_code + 1:
        np.minimum(code, s.limit, out=code)
    else:
        code[code > fmt.max_code] = replacement
    # NaN stays NaN, the quiet NaN with the input's sign (payloads are not carried). Every
    # other code is below the NaN code now, so a maximum sets it (cheaper than a select).
    nan_code = s.nan
    nan_code *= fmt.nan_code
    np.maximum(code, nan_code, out=code)
    sign = s.sign
    sign <<= fmt.bits - 1
    code |= sign
    return code
