"""The numerics detector's per-step counts with PyTorch: one bucket number per value, one
bincount, one read to the host. The counts are the reference's (reference/numerics.py:
COLUMNS); how they are computed is torch's own, from what the cast does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from common.numerics_report import COLUMNS

# NOTE [ One pass of counting ]
# Six masks summed per tensor cost a dozen passes over every value and, worse, a bool ->
# int64 conversion per mask: on one CPU thread as slow as the step itself. Instead each value
# gets ONE bucket number, and one bincount of (tensor index * STRIDE + bucket) counts every
# tensor's buckets at once; the host maps each tensor's buckets to COLUMNS (`rows`).
# The bucket edges are where the view format's cast changes what it makes of a value, found
# with the cast itself (`_edges`: the smallest value it takes past the range, NOTE [ Overflow
# without inf ], the largest it makes zero,
# searched over the wide dtype's bit patterns once per format), so the counts are still what
# `.to(dtype)` does; the reference derives the same edges from the format's bits
# (numerics.format_view holds the two equal). Two ways to number the values:
#   bucket  values                               column
#   0       x == 0 (either sign)                 zero
#   1       0 < |x| <= under                     to_zero     (the cast makes them +-0)
#   2       under < |x| < over                   (in range)
#   3       over <= |x| <= max finite            over_max    (the cast: +-inf, NaN or +-max)
#   4       +inf                                 posinf
#   5       NaN                                  nan
#   6       -inf                                 neginf
# - small concatenations (< ARITHMETIC_FROM values) or float64 ones: torch.bucketize against
#   the signed edges (one kernel, a binary search per value: about 10 ns a value on one CPU
#   thread); its ten intervals are counted as they are, the host adds the two signs' over_max
#   and to_zero intervals (_BUCKETIZE_SLOTS);
# - large float32 ones: integer arithmetic on the bits, a dozen elementwise kernels (each
#   ~0.2 ns a value; comparisons are avoided, their bool results are slow here): with
#   m = bits & 0x7fffffff, which orders |x| (NaNs above +inf), [m >= T] = clamp(m, T-1, T) -
#   (T-1), and [m >= inf] + [m >= inf+1] = clamp(m, inf-1, inf+1) - (inf-1) in one clamp:
#   bucket = [m >= 1] + [m >= under+1] + [m >= over] + ([m >= inf] + [m >= inf+1]), each
#   clamp written into one scratch tensor, the constants subtracted where the sum would pass
#   int32; then the sign moves a negative value's bucket up by 7 (bucket - 7 (bits >> 31),
#   an arithmetic shift: -1 for a negative value), so -inf is 4 + 7 = 11:
#   bucket  0 zero  1 to_zero  2 in range  3 over_max  4 +inf  5 NaN;  7-12 the same, negative
#   About twice as fast as bucketize at 300k values, and the same counts.
STRIDE = 14  # slots per tensor in the bincount: the 14 signed buckets (bucketize uses 10)
ARITHMETIC_FROM = 1 << 15
# the slots each COLUMNS entry (nan, posinf, neginf, zero, over_max, to_zero) sums
_ARITHMETIC_SLOTS = ((5, 12), (4,), (11,), (0, 7), (3, 10), (1, 8))
# bucketize's intervals: -inf, -over.., -in range, -to_zero, zero, +to_zero, +in range,
# +over.., +inf, NaN (bucketize puts NaN past every edge)
_BUCKETIZE_SLOTS = ((9,), (8,), (0,), (4,), (1, 7), (3, 5))
_CACHE: dict[tuple, object] = {}


def _search(wide: torch.dtype, hit: Callable[[torch.Tensor], bool]) -> int:
    """The smallest bit pattern of a positive `wide` value (up to +inf) where `hit` turns
    true (`hit` is monotone over positive values: their bit patterns are in value order)."""
    bits = torch.int32 if wide == torch.float32 else torch.int64
    low, high = 1, int(torch.tensor([math.inf], dtype=wide).view(bits))
    while low < high:
        mid = (low + high) // 2
        if hit(torch.tensor([mid], dtype=bits).view(wide)):
            high = mid
        else:
            low = mid + 1
    return low


# NOTE [ Overflow without inf ]
# float16's cast makes a value past its range inf, and `isinf` of the cast finds the edge. A
# float8 without inf does one of two things there, by torch version: NaN (float8_e4m3fn in
# torch 2.6-2.12, the fnuz float8s in every version) or the largest finite, +-inf included
# (float8_e4m3fn from torch 2.13: a saturating cast says nothing about where its range ends).
# So a value is past the range when its cast, read in float32, is not finite, OR when the
# cast of HALF the value, doubled, exceeds the largest finite: halving is exact and moves v
# into the binade below max, which holds every significand in every format here, so that
# cast rounds v's significand as an unbounded exponent would; doubled, it passes max exactly
# when v rounds past max. Both tests are the cast's own rounding, whichever the installed
# torch does, and they agree with the reference's thresholds from bits (common.numerics_report:
# max + ulp(max)/2, the tie going to max when max's significand is even, as in e4m3fn).


def past_range(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where `.to(dtype)` takes v (non-negative, not NaN) past dtype's range (NOTE [ Overflow
    without inf ])."""
    top = torch.finfo(dtype).max
    cast, half = v.to(dtype).float(), (v / 2).to(dtype).float()
    return ~torch.isfinite(cast) | (half * 2 > top)


def thresholds_bits(dtype: torch.dtype, wide: torch.dtype) -> tuple[int, int]:
    """(over, under) as `wide` bit patterns: the smallest positive value `.to(dtype)` takes
    past the range (to inf, to NaN, or saturated: NOTE [ Overflow without inf ]), the largest
    it makes zero."""
    key = ("bits", dtype, wide)
    if key not in _CACHE:
        if dtype == getattr(torch, "float8_e8m0fnu", None):
            raise ValueError("the numerics detector cannot view values in float8_e8m0fnu: "
                             "it has no zero and no sign")
        over = _search(wide, lambda v: bool(past_range(v, dtype)))
        under = _search(wide, lambda v: bool(v.to(dtype) != 0)) - 1
        _CACHE[key] = (over, under)
    return _CACHE[key]  # type: ignore[return-value]


def _edges(dtype: torch.dtype, wide: torch.dtype, device: torch.device) -> torch.Tensor:
    """The nine edges bucketize sorts values between (interval i: edges[i-1] < x <= edges[i])."""
    key = ("edges", dtype, wide, device)
    if key not in _CACHE:
        over, under = thresholds_bits(dtype, wide)
        bits = torch.int32 if wide == torch.float32 else torch.int64

        def value(b: int) -> float:
            return float(torch.tensor([b], dtype=bits).view(wide))

        edges = [-math.inf, -value(over), -value(under + 1), -value(1), 0.0, value(under),
                 value(over - 1), torch.finfo(wide).max, math.inf]
        _CACHE[key] = torch.tensor(edges, dtype=wide, device=device)
        nan = torch.bucketize(torch.tensor([math.nan], dtype=wide, device=device),
                              _CACHE[key])  # type: ignore[arg-type]
        if int(nan) != len(edges):
            raise RuntimeError(f"torch.bucketize on {device} puts NaN in interval {int(nan)}")
    return _CACHE[key]  # type: ignore[return-value]


def _bucketized(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.bucketize(x, _edges(dtype, x.dtype, x.device), out_int32=True)


def _arithmetic(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    over, under = thresholds_bits(dtype, torch.float32)
    inf = 0x7F800000
    u = x.view(torch.int32)
    m = u & 0x7FFFFFFF  # |x|'s bits: in value order, NaNs above +inf
    bucket = m.clamp(0, 1)  # [m >= 1]
    scratch = torch.empty_like(m)
    bucket.add_(torch.clamp(m, under, under + 1, out=scratch))  # + [m >= under+1] + under
    bucket.add_(torch.clamp(m, over - 1, over, out=scratch))  # + [m >= over] + over-1
    bucket.sub_(under + over - 1)  # < 2^31 before and after: never past int32
    bucket.add_(torch.clamp(m, inf - 1, inf + 1, out=scratch)).sub_(inf - 1)  # inf 1, NaN 2
    return bucket.sub_(torch.bitwise_right_shift(u, 31, out=scratch), alpha=7)  # sign: + 7


def bucket_counts(tensors: list[torch.Tensor], dtype: torch.dtype,
                  arithmetic: bool | None = None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(counts, columns): counts (len(tensors) * stride,) int64 on the tensors' device,
    without a sync, each tensor's count per bucket or per bucketize interval (NOTE [ One
    pass of counting ]); columns[j] lists, per COLUMNS entry, the slots it sums (`rows`).
    `arithmetic` forces a way, for tests."""
    with torch.no_grad():
        x = torch.cat([t.reshape(-1) for t in tensors])  # (n,): promoted, every value exact
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()  # all 2-byte: float32 holds them exactly
        key = ("segment", tuple(t.numel() for t in tensors), x.device)  # host ints: no sync
        segment = _CACHE.get(key)
        if segment is None:  # the same tensors every step: built once, the last one kept
            for k in [k for k in _CACHE if k[0] == "segment"]:
                del _CACHE[k]
            starts = torch.arange(len(tensors), dtype=torch.int32, device=x.device) * STRIDE
            segment = _CACHE[key] = torch.repeat_interleave(
                starts, torch.tensor(key[1], device=x.device))
        if arithmetic is None:
            arithmetic = x.dtype == torch.float32 and x.numel() >= ARITHMETIC_FROM
        buckets = _arithmetic(x, dtype) if arithmetic else _bucketized(x, dtype)
        counts = torch.bincount(segment + buckets, minlength=len(tensors) * STRIDE)
        return counts, (_ARITHMETIC_SLOTS if arithmetic else _BUCKETIZE_SLOTS)


def gathered(counts: torch.Tensor, slots: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """bucket_counts' counts as (tensors, COLUMNS) on the device: each column is the sum of
    its (at most two) slots; slot STRIDE - 1 is never a bucket, so it stands in for a missing
    second slot."""
    key = ("columns", slots, counts.device)
    if key not in _CACHE:
        _CACHE[key] = tuple(torch.tensor([c[k] if k < len(c) else STRIDE - 1 for c in slots],
                                         device=counts.device) for k in (0, 1))
    first, second = _CACHE[key]  # type: ignore[misc]
    table = counts.view(-1, STRIDE)  # (tensors, STRIDE)
    return table.index_select(1, first) + table.index_select(1, second)


def rows(counts: torch.Tensor, slots: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """bucket_counts' counts as one COLUMNS row per tensor, read to the host in one
    `.tolist()`."""
    return gathered(counts, slots).tolist()


def count_rows(tensors: list[torch.Tensor], dtype: torch.dtype,
               arithmetic: bool | None = None) -> torch.Tensor:
    """(len(tensors), COLUMNS) int64 on the tensors' device, without a sync."""
    device = tensors[0].device if tensors else torch.device("cpu")
    if not tensors:
        return torch.zeros((0, len(COLUMNS)), dtype=torch.int64, device=device)
    counts, slots = bucket_counts(tensors, dtype, arithmetic)
    sums = torch.zeros((STRIDE, len(COLUMNS)), dtype=torch.float64, device=device)
    for j, column in enumerate(slots):
        sums[list(column), j] = 1.0  # (slots, COLUMNS): which slots each column adds
    # float64 holds every count exactly (< 2^53); CUDA has no int64 matmul
    return (counts.view(len(tensors), STRIDE).double() @ sums).long()  # (tensors, COLUMNS)
