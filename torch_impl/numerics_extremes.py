"""The numerics detector's per-step counts with PyTorch for large tensors: each counted on
its magnitude's integer bits by its extremes, the small ones together, and the bucket pass
(torch_impl/numerics_counts.py) only for what reaches a special or the overflow edge. The
rows are bucket_counts' rows (NOTE [ Counting by the magnitude's extremes ]).
"""

from __future__ import annotations

import math
import threading

import torch

from common.numerics_report import COLUMNS
from torch_impl.numerics_counts import bucket_counts, gathered, rows, thresholds_bits

_CACHE: dict[tuple, object] = {}  # per process: edges, constants, scratch, segments

# NOTE [ Counting by the magnitude's extremes ]
# The bucket pass costs about 10 ns a value on one CPU thread (a concatenation, a dozen
# integer kernels and a bincount): on the transformer at 4x its width in float32, 3.2M
# values a step, 31 ms of counting beside a 27 ms step. Casting to the view format and
# counting the cast's zeros was faster, but the cast is slow exactly where the counts
# matter: a float32 -> float16 cast that makes subnormals (every small gradient) takes a
# microcode assist per value, 1.5 ns a value instead of 0.2. So a large tensor is counted on
# its integer bits alone, no float arithmetic. With m = bits & ~sign (|x|'s bits, in value
# order, NaNs above +inf) and over, under the view's edges in x's own bits (`_edges_bits`):
#   lo, hi = aminmax(m)                     one elementwise pass and one reduction
#   hi >= over     a special or a value the cast makes inf: the bucket pass counts the
#                  tensor (NOTE [ One pass of counting ])
#   else           nan, posinf, neginf and over_max are 0, and
#     lo > under   zero and to_zero are 0 too: the row is all zeros (most tensors)
#     else         zero    = numel - count_nonzero(m)             (0 when lo > 0)
#                  small   = sum(m.lt_(under+1)) = #(m <= under)  (m becomes 0s and 1s)
#                  to_zero = small - zero
# so every row is the bucket pass's row. An in-place comparison on m's integer type and a
# sum are two integer passes: a bool result (`(m <= under).sum()`) was 3x slower, and
# -sum(clamp(m - (under+1), -1, 0)), three passes, 1.5-2x (on one CPU thread). One
# scratch tensor holds m for every tensor in turn (a fresh one each costs page faults),
# kept across steps (`_scratch`).
# On the CPU (`each`) lo and hi are read right after each tensor's aminmax (reading the
# host's own memory is no sync) and the few tensors that reach an edge (a healthy step's
# small gradients) are counted at once, while m is still in the cache; elsewhere zero and
# small are computed for every tensor and everything is read once. About 0.5 ns a value
# on one CPU thread, plus 0.5 for the tensors that reach an edge.
# Below this many values a tensor's calls (about 5 us of dispatch on one CPU thread) cost
# more than its share of the one concatenated bucket pass (about 10 ns a value, with a
# fixed dozen calls for all of them): small tensors, and the whole of a small model's step,
# stay on the bucket pass. On the CPU the small tensors' concatenation is first tested
# whole by its extremes (`_small_rows`): when no value of any of them is a special or past
# the range, their rows are all zeros or, where values reach the underflow edge, three
# buckets counted by one bincount, and the bucket pass does not run (on the transformer at
# 4x its width, 80 small tensors of 34k values a step: 0.5-0.6 ms of bucket pass, where
# this costs a concatenation and a few passes; in float32 the key bias's gradient, zero
# but for rounding, always holds values the float16 view makes zero).
EXTREMES_FROM = 1 << 12
CAST_FROM = EXTREMES_FROM  # the name the count_table tests pad to
_VIEWS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def _edges_bits(dtype: torch.dtype, wide: torch.dtype) -> tuple[int, int]:
    """(over, under) as patterns of `wide` itself: |x|'s bits >= over is what the bucket
    pass counts as over_max, inf or NaN, <= under as zero or to_zero. For float32 and
    float64 thresholds_bits; a 2-byte `wide` is promoted to float32 by the bucket pass, so
    its every positive pattern is promoted and compared with float32's edges (the
    promotion is exact and in value order)."""
    if wide in (torch.float32, torch.float64):
        return thresholds_bits(dtype, wide)
    key = ("narrow", dtype, wide)
    if key not in _CACHE:
        over, under = thresholds_bits(dtype, torch.float32)
        patterns = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16)  # |x| >= 0
        promoted = patterns.view(wide).float().view(torch.int32) & 0x7FFFFFFF  # in order
        _CACHE[key] = (int(torch.count_nonzero(promoted < over)),  # the first >= over
                       int(torch.count_nonzero(promoted <= under)) - 1)  # the last <= under
    return _CACHE[key]  # type: ignore[return-value]


def _small(m: torch.Tensor, under1: torch.Tensor, zeros: bool) -> list[torch.Tensor]:
    """[#(m == 0) if `zeros`, then #(m <= under)] of the magnitude bits m, which the second
    overwrites (NOTE [ Counting by the magnitude's extremes ]); under1: under + 1, 0-d."""
    first = [m.numel() - torch.count_nonzero(m)] if zeros else []
    wide = torch.int32 if m.numel() < 1 << 31 else torch.int64
    return [*first, m.lt_(under1).sum(dtype=wide)]


def _constants(dtype: torch.dtype, wide: torch.dtype, device: torch.device
               ) -> tuple[torch.Tensor, int, int, torch.Tensor]:
    """(~sign, over, under, under + 1) for `wide` values viewed in `dtype`, the first and the
    last as 0-d tensors of wide's integer type (a Python int would be converted to one on
    every call)."""
    key = ("constants", dtype, wide, device)
    if key not in _CACHE:
        bits = _BITS[wide]
        over, under = _edges_bits(dtype, wide)
        _CACHE[key] = (torch.tensor(torch.iinfo(bits).max, dtype=bits, device=device), over,
                       under, torch.tensor(under + 1, dtype=bits, device=device))
    return _CACHE[key]  # type: ignore[return-value]


SCRATCH_KEPT = 1 << 24  # values: a larger scratch is allocated per call, not kept
SCRATCH_VIEWS = 256  # shapes: past this many (shapes that change every step) forget them


def _scratch(shape: torch.Size, bits: torch.dtype, device: torch.device, size: int
             ) -> torch.Tensor:
    """A `shape` view of one scratch tensor of `bits` of at least `size` values, the same
    across calls while it holds at most SCRATCH_KEPT values (no allocation, and its views
    are kept too: the same shapes come every step). One per thread: two threads counting
    at once never share it."""
    key = ("scratch", bits, device, threading.get_ident())
    kept = _CACHE.get(key)
    if kept is None or kept[0].numel() < size or len(kept[1]) > SCRATCH_VIEWS:  # type: ignore[index]
        buffer = torch.empty(max(size, kept[0].numel() if kept else 0),  # type: ignore[index]
                             dtype=bits, device=device)
        if buffer.numel() > SCRATCH_KEPT:
            _CACHE.pop(key, None)
            return buffer[:math.prod(shape)].view(shape)
        kept = _CACHE[key] = (buffer, {})
    buffer, views = kept  # type: ignore[misc]
    if shape not in views:
        views[shape] = buffer[:math.prod(shape)].view(shape)
    return views[shape]


def count_table(tensors: list[torch.Tensor], dtype: torch.dtype,
                each: bool | None = None) -> list[list[int]]:
    """One COLUMNS row per tensor on the host, the same as rows(*bucket_counts(...)): a
    tensor of at least EXTREMES_FROM values by its magnitude's extremes (NOTE [ Counting by
    the magnitude's extremes ]), the others by the bucket pass. `each`: read each tensor's
    extremes as they are computed (the default on the CPU); otherwise one `.tolist()` in a
    step where every large tensor is clean, a second for the bucket pass of those that
    are not."""
    if not tensors:
        return []
    if dtype not in _VIEWS:
        return rows(*bucket_counts(tensors, dtype))
    first: dict[tuple, int] = {}  # the same values seen twice (a module that returns its
    for i, t in enumerate(tensors):  # input, a dropout of p=0) are counted once
        first.setdefault((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device), i)
    if len(first) < len(tensors):
        unique = list(first.values())
        counted = dict(zip(unique, count_table([tensors[i] for i in unique], dtype, each),
                           strict=True))
        return [list(counted[first[(t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)]])
                for t in tensors]
    large = [i for i, t in enumerate(tensors) if t.dtype in _BITS and t.numel() >= EXTREMES_FROM]
    chosen = set(large)
    others = [i for i in range(len(tensors)) if i not in chosen]
    device = tensors[0].device
    each = device.type == "cpu" if each is None else each
    table: list[list[int]] = [[0] * len(COLUMNS) for _ in tensors]
    zero, to_zero = COLUMNS.index("zero"), COLUMNS.index("to_zero")
    again: list[int] = []  # not clean: the bucket pass
    with torch.no_grad():
        size = {}  # the scratch's size, per integer type
        for i in large:
            bits = _BITS[tensors[i].dtype]
            size[bits] = max(size.get(bits, 0), tensors[i].numel())
        parts: list[torch.Tensor] = []  # not `each`: lo, hi, zero, small of every tensor
        for i in large:
            t = tensors[i]
            bits = _BITS[t.dtype]
            magnitude, over, under, under1 = _constants(dtype, t.dtype, t.device)
            m = torch.bitwise_and(t.view(bits), magnitude,
                                  out=_scratch(t.shape, bits, t.device, size[bits]))
            extremes = torch.aminmax(m)
            if not each:
                parts += [*extremes, *_small(m, under1, zeros=True)]
                continue
            lo, hi = extremes[0].item(), extremes[1].item()
            if hi >= over:
                again.append(i)
            elif lo <= under:
                counted = [int(c) for c in _small(m, under1, zeros=lo == 0)]
                table[i][zero] = counted[0] if lo == 0 else 0
                table[i][to_zero] = counted[-1] - table[i][zero]
        if each and others:  # the small ones together, while they are clean
            small = _small_rows([tensors[i] for i in others], dtype)
            if small is not None:
                for i, row in zip(others, small, strict=True):
                    table[i] = row
                others = []
        flat = _read(parts, others, tensors, dtype)  # `each`: the bucket pass only
        for k, i in enumerate(large if parts else []):
            lo, hi, zeros, small = flat[4 * k:4 * k + 4]
            if hi >= _edges_bits(dtype, tensors[i].dtype)[0]:
                again.append(i)
            else:
                table[i][zero], table[i][to_zero] = zeros, small - zeros
        rest = flat[len(parts):]
        for k, i in enumerate(others):
            table[i] = rest[k * len(COLUMNS):(k + 1) * len(COLUMNS)]
        if again:  # a special or an over_max: the bucket pass, read once more
            flat = _read([], again, tensors, dtype)
            for k, i in enumerate(again):
                table[i] = flat[k * len(COLUMNS):(k + 1) * len(COLUMNS)]
    return table


def _small_rows(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[list[int]] | None:
    """The COLUMNS rows of small tensors when no value of theirs is a special or one the view
    `dtype` takes past its range, else None (the bucket pass counts them): their
    concatenation, promoted as the bucket pass promotes it (every value exact), tested
    whole by its magnitude's extremes (NOTE [ Counting by the magnitude's extremes ]), then,
    only where some value reaches the underflow edge, each value's bucket among zero,
    to_zero and in range, [m >= 1] + [m >= under+1], counted per tensor by one bincount.
    Reads the host once, twice where values reach the edge, with `.tolist()` (the CPU's
    `each`); None also for an integer tensor or no value at all."""
    if not all(t.dtype in _BITS for t in tensors):
        return None
    x = torch.cat([t.reshape(-1) for t in tensors])
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # all 2-byte: float32 holds them exactly
    if x.numel() == 0:
        return None
    magnitude, over, under, _ = _constants(dtype, x.dtype, x.device)
    bits = _BITS[x.dtype]
    m = torch.bitwise_and(x.view(bits), magnitude, out=x.view(bits))
    lo, hi = torch.stack(torch.aminmax(m)).tolist()  # one read
    if hi >= over:
        return None
    table = [[0] * len(COLUMNS) for _ in tensors]
    if lo > under:
        return table  # the usual case: every row all zeros
    key = ("segment3", tuple(t.numel() for t in tensors), x.device, bits)  # and m's type
    segment = _CACHE.get(key)
    if segment is None:  # the same tensors every step: built once, the last one kept
        for k in [k for k in _CACHE if k[0] == "segment3"]:
            del _CACHE[k]
        starts = torch.arange(len(tensors), dtype=bits, device=x.device) * 3
        segment = _CACHE[key] = torch.repeat_interleave(
            starts, torch.tensor(key[1], device=x.device))
    bucket = m.clamp(max=1)  # [m >= 1], m >= 0
    bucket += m.clamp_(under, under + 1)  # + [m >= under + 1] + under, m overwritten
    bucket += segment - under  # (under < 2^(b-1) - 3 len(tensors): no overflow)
    counts = torch.bincount(bucket, minlength=3 * len(tensors)).tolist()
    zero, to_zero = COLUMNS.index("zero"), COLUMNS.index("to_zero")
    for k, row in enumerate(table):
        row[zero], row[to_zero] = counts[3 * k], counts[3 * k + 1]
    return table


def _read(parts: list[torch.Tensor], bucketed: list[int], tensors: list[torch.Tensor],
          dtype: torch.dtype) -> list[int]:
    """The 0-d `parts`, then the bucket pass's COLUMNS row of each of tensors[bucketed], as
    one host list: one stack per integer type, one `.tolist()`."""
    kinds = sorted({p.dtype for p in parts}, key=str)
    order = [k for d in kinds for k, p in enumerate(parts) if p.dtype == d]
    flat = [torch.stack([parts[k] for k in order if parts[k].dtype == d]).to(torch.int64)
            for d in kinds]
    if bucketed:
        counts, slots = bucket_counts([tensors[i] for i in bucketed], dtype)
        flat.append(gathered(counts, slots).reshape(-1))
    read = torch.cat(flat).tolist() if flat else []
    values = [0] * len(parts)
    for k, v in zip(order, read, strict=False):
        values[k] = v
    return values + read[len(parts):]
