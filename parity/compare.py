"""Comparisons behind each claim kind (see parity/tolerances.py).

`measure(claim, actual, expected, scale=S)` returns the observed worst case in the claim's
own unit, so the tests and `python -m parity report` judge with one function,
`holds(claim, observed)`:

    kind         observed                                         holds when
    bits         count of elements whose bit patterns differ      observed <= 0
    nan_class    the same, every NaN one class                    observed <= 0
    ulps         max ulps of `fmt` between the two sides          observed <= k
    eps          max |a-b| / (eps S), S the claim's `scale`       observed <= c
    statistical  the smallest p-value of the test's statistics    observed >= alpha
                 (the test's own: assert_observed)

Where the two sides disagree on which elements are NaN, `ulps` and `eps` observe inf;
elements NaN on both sides, and equal infinities, differ by 0. An `ulps` claim compares
values already rounded into its format: both sides must have the same shape and dtype and
hold only members of the format, or the claim fails naming the first outsider (rounding both
sides here would hide a missing final rounding as 0 ulps). `assert_claim` raises an
AssertionError that names the claim, the observed value, and for `eps` the raw max |a-b|
beside it.

NOTE [ Which side is expected ]: `assert_claim(claim_id, *, actual=, expected=, context="",
scale=None)` takes the two arrays by name only (a positional call is a TypeError). `expected`
is the side the claim holds the other to, the first of:
    1. a truth the test states: a value worked by hand, a formula or a prediction (memory,
       FLOPs, recomputation counts), an exact oracle (rational arithmetic, IEEE sqrt), a
       declared table, a committed figure, a count of 0;
    2. a library outside the two trees (ml_dtypes, torchao), or the library behaviour a named
       variant reproduces (the reference's via="float32" or overflow policy against torch's
       cast, rceil_log2f against torch's float32 log2);
    3. the reference, against torch (torch_impl, or torch itself): the reference states the
       mechanism (the math lives once, in the reference);
    4. within one side, the plain computation against its variant: eager against compiled,
       uninterrupted against resumed, unsharded against sharded, stored against recomputed,
       float32 against a low-precision reduction, rank 0 against another rank, the engine's
       order (the ring) against another order.
`actual` is the other side. The measurement is symmetric, so which side is which never
changes a verdict, only the messages' labels (a shape or dtype mismatch, the side holding a
non-member of an ulps claim): `scale` is passed on its own, both sides must have the same
shape and dtype (the n recorded and eps(dtype) are the same either way), and |a - b|, the
ulp distance, the bit and NaN-class comparisons do not depend on the order.

Every `assert_claim` also records what it observed (`record`): per claim, the worst case
over every call, the number of values compared, the raw max |a-b| behind an eps claim,
 and whether every call held. `python -m parity report` is a quick run of the parity
tests that prints this record (parity/lab/report.py), so the report and the tests measure
the same thing on the same inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from parity.tolerances import Claim, claim

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def as_numpy(x: Any) -> np.ndarray:
    """A NumPy array holding the same bits as `x` (NumPy array, torch tensor or scalar).

    torch dtypes NumPy lacks (bfloat16, float8_*) come across as their unsigned bit view,
    reinterpreted with ml_dtypes' types so values stay values.
    """
    if type(x).__module__.startswith("torch"):
        import ml_dtypes
        import torch

        t = x.detach().cpu()
        lacking = {
            torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
            torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
            torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
        }
        if t.dtype in lacking:
            int_dtype, np_dtype = lacking[t.dtype]
            return t.view(int_dtype).numpy().view(np_dtype)
        return t.numpy()
    return np.asarray(x)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a format's name: NumPy's own (float16, float32, float64), or the
    ml_dtypes type of that name (bfloat16, float8_*, float6_*, float4_*), as in as_numpy."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name, None) or name)


def bit_view(x: Any) -> np.ndarray:
    """The unsigned-integer view of an array's bytes (same shape)."""
    a = np.ascontiguousarray(as_numpy(x))
    return a.view(_UINT_OF_SIZE[a.dtype.itemsize])


def _float64(x: Any) -> np.ndarray:
    """The values of `x` in float64 (exact for every format here; a signaling NaN becomes a
    quiet one, which NumPy would otherwise warn about)."""
    with np.errstate(invalid="ignore"):
        return as_numpy(x).astype(np.float64)


def _is_nan(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "biu":
        return np.zeros(a.shape, dtype=bool)
    return np.isnan(_float64(a))


def _same_shape(a: np.ndarray, b: np.ndarray, where: str = "") -> None:
    if a.shape != b.shape:
        raise AssertionError(f"{where}shapes differ: actual {a.shape} vs expected {b.shape}")


def _same_shape_and_dtype(a: np.ndarray, b: np.ndarray, where: str = "") -> None:
    _same_shape(a, b, where)
    if a.dtype != b.dtype:
        raise AssertionError(f"{where}dtypes differ: actual {a.dtype} vs expected {b.dtype}")


def mismatches(kind: str, actual: Any, expected: Any) -> np.ndarray:
    """Boolean mask of the elements that break a `bits` or `nan_class` claim: differing bit
    patterns (for `nan_class`, any NaN equals any NaN, and a NaN differs from any number)."""
    a, b = as_numpy(actual), as_numpy(expected)
    _same_shape_and_dtype(a, b)
    differ = bit_view(a) != bit_view(b)
    if kind == "nan_class":
        nan_a, nan_b = _is_nan(a), _is_nan(b)
        differ = np.where(nan_a | nan_b, nan_a != nan_b, differ)
    return differ


def _abs_difference(a: Any, b: Any) -> tuple[np.ndarray, bool]:
    """(|a - b| in float64 with 0 where a == b or both are NaN, whether the NaN sets differ)."""
    a64, b64 = _float64(a), _float64(b)
    _same_shape(a64, b64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a64 - b64)
    return np.where((a64 == b64) | (nan_a & nan_b), 0.0, diff), bool(np.any(nan_a != nan_b))


def eps_of(dtype: Any) -> float:
    """Machine epsilon of a floating dtype, NumPy's or ml_dtypes' (bfloat16, float8_*)."""
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).eps)


def in_eps_units(actual: Any, expected: Any, scale: Any) -> np.ndarray:
    """|a - b| / (eps(dtype) * scale), elementwise, in float64 (0 where a == b exactly,
    equal infinities and NaN pairs included; inf where a != b and the scale is 0).

    The difference of two float32/float64 values within a factor 2 of each other is exact
    in float64 (Sterbenz), so the units are not blurred by the measurement itself.
    """
    a, b = as_numpy(actual), as_numpy(expected)
    _same_shape_and_dtype(a, b)
    diff, _ = _abs_difference(a, b)
    s = np.broadcast_to(np.abs(np.asarray(scale, dtype=np.float64)), diff.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        units = diff / (eps_of(a.dtype) * s)
    return np.where(diff == 0, 0.0, units)


def max_abs_difference(actual: Any, expected: Any) -> float:
    """max |a - b| in float64 over elements that are not NaN on both sides (inf if the NaN
    sets differ): the raw number a report prints beside an eps claim's ratio."""
    diff, nan_sets_differ = _abs_difference(actual, expected)
    return float("inf") if nan_sets_differ else float(np.max(diff, initial=0.0))


def non_members(x: Any, fmt: str) -> np.ndarray:
    """Boolean mask of the elements of `x` that are not values of the format `fmt`.

    v is a member when encoding it into `fmt` and decoding gives v back bit for bit (in
    float64, which holds every value of every format here, signed zeros included). NaN is a
    member (every format has one); infinity only where the format has it.
    """
    from reference.formats import decode, encode, get_format

    f = get_format(fmt)
    v = np.ascontiguousarray(_float64(x))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        back = decode(encode(v, f), f, dtype=np.float64)
    return ~np.isnan(v) & (back.view(np.uint64) != v.view(np.uint64))


def _ulps(c: Claim, actual: Any, expected: Any) -> float:
    """The `ulps` branch of `measure`: members only, NaN positions must agree."""
    from parity.ulps import ulp_distance
    from reference.formats import get_format

    a, b = as_numpy(actual), as_numpy(expected)
    _same_shape_and_dtype(a, b, f"claim {c.id}: ")
    for side, x in (("actual", a), ("expected", b)):
        if x.dtype.kind in "biuSUOMm":
            raise AssertionError(f"claim {c.id}: the {side} side has dtype {x.dtype}; an ulps "
                                 "claim compares floating-point values")
        outside = np.flatnonzero(non_members(x, c.fmt))  # type: ignore[arg-type]
        if outside.size:
            i = int(outside[0])
            v = float(x.reshape(-1)[i])
            raise AssertionError(
                f"claim {c.id}: the {side} side holds {outside.size} value(s) that are not "
                f"members of {c.fmt}, the first at flat index {i}: {v!r} ({v.hex()}); an ulps "
                f"claim compares values already rounded to {c.fmt} (a missing rounding?)")
    a64, b64 = _float64(a), _float64(b)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if np.any(nan_a != nan_b):
        return float("inf")
    both = ~nan_a
    return float(np.max(ulp_distance(a64[both], b64[both], get_format(c.fmt)), initial=0))


def measure(c: Claim, actual: Any, expected: Any, *, scale: Any = None) -> float:
    """The observed worst case of `actual` against `expected` in the claim's unit."""
    if c.kind in ("bits", "nan_class"):
        return float(np.count_nonzero(mismatches(c.kind, actual, expected)))
    if c.kind == "ulps":
        return _ulps(c, actual, expected)
    if c.kind == "eps":
        if scale is None:
            raise ValueError(f"claim {c.id}: an eps claim is measured against its scale S "
                             f"({c.scale}); pass scale=")
        _, nan_sets_differ = _abs_difference(actual, expected)
        if nan_sets_differ:
            return float("inf")
        return float(np.max(in_eps_units(actual, expected, scale), initial=0.0))
    if c.kind == "statistical":
        raise ValueError(f"claim {c.id}: a statistical claim's test computes its own p-value "
                         "and asserts it with assert_observed")
    raise ValueError(f"claim {c.id}: unknown kind {c.kind!r}")


def holds(c: Claim, observed: float) -> bool:
    """Whether an observed worst case is within the claim's bound (see the module's table):
    at most the bound, or for a statistical claim a p-value at least the bound; a NaN
    observation never holds."""
    if c.kind == "statistical":
        return observed >= float(c.bound)
    return observed <= float(c.bound)


def _first_mismatches(kind: str, actual: Any, expected: Any) -> str:
    bad = np.flatnonzero(mismatches(kind, actual, expected))[:5]
    a = as_numpy(actual).reshape(-1)
    b = as_numpy(expected).reshape(-1)
    ba, bb = bit_view(a), bit_view(b)
    return "; ".join(
        f"[{i}] {a[i]!r} (0x{int(ba[i]):x}) vs {b[i]!r} (0x{int(bb[i]):x})" for i in bad)


@dataclass
class Observed:
    """What the assertions of one claim observed so far: the worst case in the claim's unit
    (the largest; for a statistical claim the smallest p-value), the values compared, the
    largest raw max |a-b| (eps claims), and whether every assertion held."""

    worst: float
    n: int
    raw: float | None
    held: bool
    calls: int = 1


RECORD: dict[str, Observed] = {}
_SEEDED: list[str] = []  # claims inside expect_broken: their assertions are not recorded


@contextmanager
def expect_broken(claim_id: str) -> Iterator[None]:
    """The block must break the claim (a seeded fault proving a test can see): it raises the
    claim's AssertionError, which is swallowed, and what it observed is not recorded, since
    a fault put in on purpose says nothing about the code under test. AssertionError when the
    block holds the claim."""
    _SEEDED.append(claim_id)
    try:
        yield
    except AssertionError as e:
        if f"claim {claim_id} " not in str(e):
            raise
    else:
        raise AssertionError(f"claim {claim_id} held where a seeded fault must break it")
    finally:
        _SEEDED.pop()


def record(c: Claim, observed: float, n: int, raw: float | None = None) -> None:
    """Add one assertion's observation to RECORD (see the module docstring); nothing inside
    expect_broken(c.id) is recorded."""
    if c.id in _SEEDED:
        return
    held = holds(c, observed)
    seen = RECORD.get(c.id)
    if seen is None:
        RECORD[c.id] = Observed(observed, n, raw, held)
        return
    worse = (min if c.kind == "statistical" else max)(seen.worst, observed)
    # NaN never holds and is the worst of all: keep it once seen
    seen.worst = observed if observed != observed else (seen.worst if seen.worst != seen.worst
                                                        else worse)
    seen.n += n
    if raw is not None:
        seen.raw = raw if seen.raw is None else max(seen.raw, raw)
    seen.held = seen.held and held
    seen.calls += 1


def assert_observed(claim_id: str | Claim, observed: float, n: int, context: str = "") -> float:
    """Assert a claim whose test counts its own observation (mismatching runs, refusals of
    another class): record it like assert_claim does and raise the same
    AssertionError when it does not hold; return `observed`."""
    c = claim_id if isinstance(claim_id, Claim) else claim(claim_id)
    record(c, observed, n)
    if not holds(c, observed):
        raise AssertionError(f"claim {c.id} ({c.tolerance}) broken"
                             f"{' ' + context if context else ''}: observed {observed:g} over "
                             f"{n} compared. {c.statement}")
    return observed


def _unverified_note(c: Claim) -> str:
    """For a claim stating a library's own behaviour, run on a version of it the claims were
    never verified on (parity.claims.VERIFIED): that version, named, since the library may
    have changed what the claim states."""
    from parity.claims import VERIFIED, installed_versions

    versions = c.unverified(installed_versions())
    if not versions:
        return ""
    verified = "; ".join(f"{lib} {', '.join(v)}" for lib, v in VERIFIED.items()
                         if any(u.startswith(lib + " ") for u in versions))
    return (f" [on {', '.join(versions)}: not a version this claim was verified on ({verified})"
            "; the library may have changed the behaviour the claim states]")


def assert_claim(claim_id: str | Claim, *, actual: Any, expected: Any, context: str = "",
                 scale: Any = None) -> float:
    """Assert the claim (an id of the registry, or a Claim) for these two arrays, named by the
    rule of NOTE [ Which side is expected ]; return the observed worst case."""
    c = claim_id if isinstance(claim_id, Claim) else claim(claim_id)
    observed = measure(c, actual, expected, scale=scale)
    raw = max_abs_difference(actual, expected) if c.kind == "eps" else None
    record(c, observed, int(as_numpy(actual).size), raw)
    if not holds(c, observed):
        detail = ""
        if c.kind in ("bits", "nan_class"):
            detail = _first_mismatches(c.kind, actual, expected)
        elif c.kind == "eps":
            detail = f"(max |a-b| = {raw:g})"
        raise AssertionError(
            f"claim {c.id} ({c.tolerance}) broken{' ' + context if context else ''}: "
            f"observed {observed:g}. {c.statement} {detail}{_unverified_note(c)}"
        )
    return observed
