"""reference.formats.encode's fast path: the same codes as formats.encode_stepwise, block by block.

See reference/formats.py for the math (the module docstring: W, shift, kept, nearest-even in
one carry) and for its readable statement, `encode_stepwise` (decompose, round, pack, each a
NumPy expression over the whole array). This module computes the same codes faster, and
lists only what differs; tests/test_encode_fast.py holds the two bit-equal on every edge.

    encode_blocks   the array, block by block, in per-thread working arrays (NOTE
                    [ Encoding in blocks ]), each block through the steps below
    magnitude       word -> |word|, the sign and the NaN mask kept aside (except where the
                    carry runs on the signed word: round_signed_word, bfloat16)
    round           |word| -> |code| before the overflow policy:
                      nearest_even        round_nearest_even (the carry; NOTE [ Nearest-even
                                          in two ranges ] for targets with fewer binades)
                      toward_zero,        decompose into (W, shift), then round_dropped_bits
                      stochastic
    pack            |code| -> code      overflow policy, NaN, sign, by convention: ieee and
                                        fn; pack_fnuz (the NaN is the sign bit alone, no -0);
                                        pack_finite (saturating, a NaN gives a zero); in
                                        reference/encode_pack.py
    round_unsigned  word -> code        the exponent-only E8M0 (no sign, no zero): the whole
                                        block in one, the carry of the fraction into E

Every step writes into the block's working arrays (`Scratch`) with `out=` or an in-place
operator: no NumPy temporary is allocated per operation. Which form an operation takes is
chosen by what NumPy vectorizes (NOTE [ NumPy's fast forms ]); the arithmetic is the same.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import numpy as np

from common.format_spec import FLOAT64, FORMATS, FloatFormat
from reference.encode_pack import pack

__all__ = ["BLOCK", "Plan", "Scratch", "decompose", "encode_blocks", "magnitude",
           "round_dropped_bits", "round_nearest_even", "round_signed_word"]

# NOTE [ Encoding in blocks ]
# encode makes 8 (bfloat16) to 16 (float16, float8) elementwise passes when rounding to
# nearest. Over a large array each pass would stream the whole array through memory, and a
# NumPy expression allocates a fresh temporary per operation (as encode_stepwise does).
# Allocation is the trap: freeing large temporaries returns memory to the kernel (glibc
# trims the heap top, and unmaps what it mapped for arrays above its mmap threshold), and
# the next allocation faults fresh pages in one by one. So encode runs the rounding block
# by block, every operation writing into working arrays (`out=`, in-place operators) that
# each thread allocates once and keeps from call to call (Scratch.for_thread: 2 MiB per
# thread for float32 input, 4 for float64): no page is faulted in twice, within a call or
# across calls. A block's arrays (2^16 uint32 elements are 256 KiB each) stay in the
# last-level cache, and NumPy's fixed cost per operation (about a microsecond, more with a
# scalar operand) is spread over 2^16 elements (at 2^14 it was about 40% of the time; 2^17
# and 2^18 measured no faster). The rounding does not know about blocks: any BLOCK gives the
# same codes. Stochastic rounding's uint64 words are the one branch that still allocates.
BLOCK = 1 << 16

# NOTE [ NumPy's fast forms ]
# NumPy 2's SIMD loops cover an array combined with a scalar, or two contiguous arrays, for
# add, subtract, the shifts and the bitwise operators, and an in-place operator (`w += 1`)
# touches one array instead of three. They do not cover np.minimum/np.maximum against a
# scalar: that runs element by element, about 5x slower than against an array (measured
# 0.5 against 0.1 ns per element on a cached block of 2^16 uint32). So the overflow policy's
# minimum is taken against `Scratch.limit`, an array holding the policy's code, and the
# smallest normal's against `Scratch.smallest`. Each operation also costs a fixed ~0.4-1 us
# (more with a Python int operand, whose type NumPy must resolve: constants are passed as
# the word's own type), so a block does few operations. A NaN is rare in real data: the NaN
# mask is one comparison into bools, and the NaN code is written only where it is set.


class Plan(NamedTuple):
    """The constants of one (source, target, overflow policy), computed once: 0-d arrays of
    the word's type (NOTE [ NumPy's fast forms ]), or None where a step does not apply."""

    src: FloatFormat
    fmt: FloatFormat
    word: type  # the source's words: np.uint32 (float32) or np.uint64 (float64)
    code: type  # the target's codes (fmt.code_dtype)
    lowest: int  # the target's lowest binade 1 - b, as a biased exponent of the source
    drop: np.ndarray  # m_src - m: the bits every normal result drops
    half_less_one: np.ndarray  # 2^(drop-1) - 1 - ((lowest - 1) << m_src), mod the word's width
    one: np.ndarray
    power: np.ndarray | None  # 2^p as a source float, where lowest > 1 (NOTE [ Nearest-..)
    power_bits: np.ndarray | None  # its bits
    source_sign: np.ndarray  # bits - 1 of the source: where its sign bit sits
    code_sign: np.ndarray  # bits - 1 of the target: where the code's sign bit goes
    magnitude_mask: np.ndarray  # the source's bits less the sign
    inf: np.ndarray  # the source's infinity, as bits
    replacement: int  # the code a result beyond max becomes (replacement_code)
    overflows: bool  # whether a non-NaN input can give a code beyond the replacement
    signed: bool  # whether the carry may run on the signed word (round_signed_word)
    nan_shifted: np.ndarray  # the infinity's bits shifted left by one (the sign dropped)
    half: np.ndarray  # 2^(m_src - 1): half the source's unit in its last place, at E = 1
    fraction_mask: np.ndarray  # 2^m_src - 1: the source's fraction field
    code_bits: np.ndarray  # the target's width in bits
    code_ones: np.ndarray  # 2^bits - 1 of the target

    @staticmethod
    @functools.cache
    def of(src: FloatFormat, fmt: FloatFormat, overflow: str) -> Plan:
        uint = np.uint32 if src.bits == 32 else np.uint64
        lowest = lowest_binade(src, fmt)
        drop = src.mantissa_bits - fmt.mantissa_bits
        p = fmt.min_exponent - fmt.mantissa_bits + src.mantissa_bits
        power = np.ldexp(np.ones((), dtype=src.name), p) if lowest > 1 else None
        # With the source's top binade and overflow="inf", the source's largest finite value
        # rounds at most to the infinity's code, the replacement (bfloat16, tf32).
        top_is_inf = overflow == "inf" and fmt.max_exponent >= src.max_exponent
        half_less_one = 2 ** (drop - 1) - 1 - ((lowest - 1) << src.mantissa_bits) if drop else 0
        return Plan(
            src=src, fmt=fmt, word=uint, code=fmt.code_dtype, lowest=lowest,
            drop=np.array(drop, uint),
            half_less_one=np.array(half_less_one % 2**src.bits, uint), one=np.array(1, uint),
            power=power, power_bits=None if power is None else power.view(uint),
            source_sign=np.array(src.bits - 1, uint), code_sign=np.array(fmt.bits - 1, uint),
            magnitude_mask=np.array(2 ** (src.bits - 1) - 1, uint),
            inf=np.array(src.inf_code, uint), replacement=replacement_code(fmt, overflow),
            overflows=not top_is_inf, signed=lowest == 1 and top_is_inf and drop > 0,
            nan_shifted=np.array((src.inf_code << 1) % 2**src.bits, uint),
            half=np.array(1 << (src.mantissa_bits - 1), uint),
            fraction_mask=np.array(2**src.mantissa_bits - 1, uint),
            code_bits=np.array(fmt.bits, uint), code_ones=np.array(2**fmt.bits - 1, uint))


class Scratch(NamedTuple):
    """encode's working arrays, one block long, named for what they first hold; the last
    two hold constants, refilled when the format or the policy changes (NOTE [ NumPy's
    fast forms ])."""

    magnitude: np.ndarray  # |word|, then W or the carried word, then the code
    shift: np.ndarray  # the source's binade, then the shift (decompose)
    odd: np.ndarray  # the lowest kept bit
    carry: np.ndarray  # the binades below (decompose)
    below: np.ndarray  # |x| + 2^p as a float, then the code it gives (NOTE [ Nearest-even..)
    sign: np.ndarray  # the sign bit, then the code's sign
    nan: np.ndarray  # bool: the input is a NaN
    limit: np.ndarray  # the overflow policy's code
    smallest: np.ndarray  # the target's smallest normal, as a source magnitude

    @classmethod
    def for_thread(cls, n: int, plan: Plan) -> Scratch:
        """The calling thread's arrays for blocks of n elements from `plan.src`, kept from
        call to call (NOTE [ Encoding in blocks ]), their constants filled for the plan."""
        pool = _POOL.__dict__.setdefault("arrays", {})
        key = (plan.src.bits, n)
        if key not in pool:
            uint = np.uint32 if plan.src.bits == 32 else np.uint64
            pool[key] = _Pooled(cls(*(np.empty(n, dtype=bool if name == "nan" else uint)
                                      for name in cls._fields)))
        pooled = pool[key]
        if pooled.filled_for is not plan:
            pooled.scratch.limit.fill(plan.replacement)
            pooled.scratch.smallest.fill(plan.lowest << plan.src.mantissa_bits)
            pooled.filled_for = plan
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
    """A thread's Scratch and the plan its constants were filled for."""

    def __init__(self, scratch: Scratch) -> None:
        self.scratch, self.filled_for = scratch, None


_POOL = threading.local()  # each thread's Scratch arrays, by (source width, block length)


def lowest_binade(src: FloatFormat, fmt: FloatFormat) -> int:
    """The target's lowest binade 1 - b, as a biased exponent of the source."""
    return fmt.min_exponent + src.bias


def replacement_code(fmt: FloatFormat, overflow: str) -> int:
    """The code (sign cleared) a result beyond fmt.max becomes under the overflow policy;
    fnuz's NaN is the sign bit alone, max_code + 1, which pack_fnuz keeps whatever the sign."""
    if overflow == "inf":
        return fmt.inf_code  # type: ignore[return-value]  (None only where refused earlier)
    if overflow == "saturate":
        return fmt.max_code
    return fmt.max_code + 1 if fmt.convention == "fnuz" else fmt.nan_code  # type: ignore


def magnitude(word: np.ndarray, plan: Plan, s: Scratch) -> np.ndarray:
    """|word| (the source's bits without the sign), in `s.magnitude`; the sign bit goes to
    `s.sign`, and `s.nan` is True where x is a NaN (|word| above the infinity's)."""
    np.right_shift(word, plan.source_sign, out=s.sign)
    mag = np.bitwise_and(word, plan.magnitude_mask, out=s.magnitude)
    np.greater(mag, plan.inf, out=s.nan)
    return mag


# NOTE [ Nearest-even in two ranges ]
# Where the target has every binade of the source at or above its smallest normal 2^(1-b),
# W is |word| less the binades below it, shift is the constant drop = m_src - m, and the
# nearest-even carry of reference/formats.py is
#     |code| = (|word| - ((lowest - 1) << m_src) + half - 1 + odd) >> drop,    half = 2^(drop-1)
# applied to max(|word|, smallest normal): every input below 2^(1-b) gives 2^m there, the
# smallest normal's code. Below 2^(1-b) the target's spacing is the subnormal one,
# 2^(1-b-m), and one IEEE addition rounds to it: with p = 1 - b - m + m_src, |x| + 2^p lies
# in [2^p, 2^(p+1)), whose spacing is exactly 2^(1-b-m), so the sum is |x| rounded to
# nearest-even on that grid, and the sum's bits less 2^p's bits count its steps: the code.
# Above 2^(1-b) that count is never below the true code (the target's grid is as fine in
# its first binade and coarser above it, so it has no more points below |x|); it is 2^m_src
# or more once |x| >= 2^p, and larger still for inf and NaN. So the code is the smaller of
# the two. The sum is normal whatever |x| is, so a flush-to-zero mode would not change it,
# and a source subnormal (|x| < 2^-126 for float32) lies far below half the target's
# smallest subnormal: it rounds to 0 either way.


def round_nearest_even(mag: np.ndarray, plan: Plan, s: Scratch) -> np.ndarray:
    """|code| of |word| rounded to nearest, ties to even (before the overflow policy), in
    `s.magnitude`: the carry of reference/formats.py with one shift for every element, and
    below the target's smallest normal one float addition (NOTE [ Nearest-even in two
    ranges ])."""
    if not plan.drop:
        return mag  # nothing dropped (a target as precise as the source): W is kept
    below = None
    if plan.power is not None:  # lowest > 1: the target lacks the source's lowest binades
        below = np.add(mag.view(plan.power.dtype), plan.power, out=s.below.view(plan.power.dtype))
        below = below.view(mag.dtype)
        below -= plan.power_bits  # the steps of 2^(1-b-m) from 2^p up to the sum
        np.maximum(mag, s.smallest, out=mag)
    odd = np.right_shift(mag, plan.drop, out=s.odd)
    odd &= plan.one
    mag += odd
    mag += plan.half_less_one
    mag >>= plan.drop
    if below is not None:
        np.minimum(mag, below, out=mag)
    return mag


def round_signed_word(word: np.ndarray, plan: Plan, s: Scratch) -> np.ndarray:
    """The code of each word rounded to nearest, ties to even, sign included, where the
    target has every binade of the source and overflow is "inf" (bfloat16, tf32; `plan.signed`):
    round_nearest_even's carry applied to the whole word, in `s.magnitude`.

    The target then has the source's exponent field, so drop = source bits - target bits and
    the shift takes the sign bit to the code's. The carry never reaches the sign: |word| +
    half - 1 + odd is at most the infinity's bits plus half for every non-NaN word, and a
    finite word beyond max carries into the infinity's code, which is the policy's. A NaN's
    carry could reach either, so NaN codes are written afterwards, with the input's sign.
    """
    twice = np.left_shift(word, plan.one, out=s.magnitude)  # |word| << 1: the sign dropped
    np.greater(twice, plan.nan_shifted, out=s.nan)
    odd = np.right_shift(word, plan.drop, out=s.odd)
    odd &= plan.one
    code = np.add(word, odd, out=s.magnitude)
    code += plan.half_less_one
    code >>= plan.drop
    if s.nan.any():
        code[s.nan] = (word[s.nan] >> plan.source_sign << plan.code_sign) | plan.fmt.nan_code
    return code


def decompose(mag: np.ndarray, plan: Plan, s: Scratch) -> tuple[np.ndarray, object]:
    """(W, shift) of each magnitude: x = (-1)^sign * M * 2^q, placed in the target's binades
    as W = ((t - (1 - b)) << (m + shift)) + M.

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
    src, lowest, drop = plan.src, plan.lowest, int(plan.drop)
    if lowest == 1:  # the target has every binade of the source: one shift for all (bf16)
        return mag, mag.dtype.type(drop)
    binade = np.minimum(mag, s.smallest, out=s.shift)  # min(|word|, lowest << m_src)
    binade >>= src.mantissa_bits  # min(E, lowest)
    below = np.subtract(binade, 1, out=s.carry)
    below <<= src.mantissa_bits  # (binade - 1) << m_src
    w = mag
    w -= below
    shift = np.subtract(lowest + drop, binade, out=binade)
    return w, shift


def round_dropped_bits(w: np.ndarray, shift: object, rounding: str, u: np.ndarray | None,
                       s: Scratch) -> np.ndarray:
    """kept: W with `shift` bits dropped by the rounding rule (reference/formats.py), in W's
    array: toward_zero and stochastic (nearest_even: round_nearest_even).

    Shifts past the word's width give 0 in NumPy (all bits dropped), which is what rounding
    a value far below half the smallest subnormal needs."""
    uint = w.dtype.type
    if rounding == "stochastic":
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
    w >>= shift  # toward_zero drops the bits
    return w


def round_unsigned(word: np.ndarray, plan: Plan, rounding: str, u: np.ndarray | None,
                   s: Scratch) -> np.ndarray:
    """The codes of an exponent-only unsigned format (E8M0) for one block: reference/
    small_formats.py's encode_unsigned, on the source's bits.

    For a positive normal x with biased exponent E and fraction F, floor(log2 x) is
    E - bias_src, so the code is E - (bias_src - bias) plus one where F calls for it:
    nearest (ties up, NOTE [ E8M0 ties ]) is the carry of F + 2^(m_src-1) into E;
    stochastic adds u < floor(2^32 F / 2^m_src); toward_zero adds nothing. The offset
    bias_src - bias is plan.lowest, the target's lowest binade, so taking the maximum with
    `s.smallest` (lowest << m_src) before subtracting it sends everything below 2^-bias to
    code 0, the smallest value; the overflow minimum sends the rest beyond max (+inf too) to
    the policy's code. x < 0 and NaN are the words w with w - 1 >= inf's bits (unsigned:
    the sign bit and NaNs are above) but for -0 and +0 (0 wraps around too), which are below
    2^-bias: code 0 (NOTE [ E8M0 at zero ])."""
    fmt = plan.fmt
    bad = np.subtract(word, plan.one, out=s.carry)
    np.greater_equal(bad, plan.inf, out=s.nan)  # +-0, negatives, NaN: no such value
    mag = np.bitwise_and(word, plan.magnitude_mask, out=s.magnitude)
    if rounding == "nearest_even":
        mag += plan.half
    elif rounding == "stochastic":
        frac = np.bitwise_and(mag, plan.fraction_mask, out=s.odd).astype(np.uint64)
        drop = plan.src.mantissa_bits - 32  # the top 32 bits of F (float32: F << 9)
        top32 = frac >> np.uint64(drop) if drop >= 0 else frac << np.uint64(-drop)
        mag += (u < top32).astype(mag.dtype) << plan.drop  # F's bits are shifted out below
    np.maximum(mag, s.smallest, out=mag)
    mag -= s.smallest
    code = np.right_shift(mag, plan.drop, out=mag)  # drop = m_src (m = 0)
    np.minimum(code, s.limit, out=code)
    if s.nan.any():
        code[s.nan] = fmt.nan_code
        code[(word & plan.magnitude_mask) == 0] = 0  # +-0: the smallest value, not NaN
    return code


def encode_blocks(x: np.ndarray, fmt: FloatFormat, rounding: str, words: np.ndarray | None,
                  overflow: str, subnormals: bool) -> np.ndarray:
    """The codes of formats.encode_stepwise for x as formats.encode has checked and prepared
    it (float32 or float64, contiguous; `words` the uint64 words of stochastic rounding, else
    None; `overflow` the policy that applies), BLOCK elements at a time."""
    src = FORMATS["float32"] if x.dtype == np.float32 else FLOAT64
    plan = Plan.of(src, fmt, overflow)
    codes = np.empty(x.shape, dtype=plan.code)
    flat_x, flat_codes = x.reshape(-1), codes.reshape(-1)  # views (x is contiguous)
    scratch = Scratch.for_thread(BLOCK, plan)
    with np.errstate(invalid="ignore"):  # a signalling NaN's float addition: the NaN is kept
        for start in range(0, x.size, BLOCK):
            block = slice(start, start + BLOCK)
            s = scratch.first(min(BLOCK, x.size - start))  # the last block may be shorter
            word = flat_x[block].view(plan.word)
            if fmt.convention == "unsigned":
                u = None if words is None else words.reshape(-1)[block]
                flat_codes[block] = round_unsigned(word, plan, rounding, u, s)
                continue
            if rounding == "nearest_even" and plan.signed and subnormals:
                flat_codes[block] = round_signed_word(word, plan, s)
                continue
            mag = magnitude(word, plan, s)
            if rounding == "nearest_even":
                kept = round_nearest_even(mag, plan, s)
            else:
                w, shift = decompose(mag, plan, s)
                u = None if words is None else words.reshape(-1)[block]
                kept = round_dropped_bits(w, shift, rounding, u, s)
            flat_codes[block] = pack(kept, plan, subnormals, s)
    return codes
