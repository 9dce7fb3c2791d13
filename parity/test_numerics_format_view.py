"""The numerics detector's format view is the same in both trees: thresholds derived from a
format's bits count the values torch's cast sends to inf or to zero (numerics.format_view).
Drivers: parity/drivers/numerics.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from common.format_spec import get_format
from parity.compare import assert_claim
from parity.drivers.numerics import count_rows
from parity.drivers.train import one_thread
from parity.strategies import examples, float32_arrays
from reference.numerics import COLUMNS, thresholds

# every format the detector views values in: float8_e4m3fn's cast saturates in torch >= 2.13
# (NaN before), the fnuz float8s' makes NaN, neither has an inf (NOTE [ Overflow without inf ])
VIEWS = ["float16", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz",
         "float8_e5m2fnuz"]


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize("arithmetic", [False, True, "cast"],
                         ids=["bucketize", "arithmetic", "cast"])
@pytest.mark.parametrize("fmt", VIEWS)
@settings(examples(60))
@given(data=st.data())
def test_format_view_counts_match_torch_casts_bitwise(fmt: str, arithmetic: bool | str,
                                                      data: st.DataObject, device: str) -> None:
    """Thresholds derived from the format's bits count exactly the values torch's cast sends
    to inf or zero, around both edges and everywhere else, whichever way torch numbers the
    values (bucketize, or integer arithmetic on the bits)."""
    x = data.draw(float32_arrays(fmt))
    ref, got = count_rows(x, fmt, device, arithmetic)
    for name, v in zip(COLUMNS, ref, strict=True):
        if v:
            event(f"{fmt}: {name} reached")
    assert_claim("numerics.format_view", actual=got, expected=ref, context=f"{fmt} {x!r}")


def _first_float32_at_or_above(v: float) -> np.float32:
    f = np.float32(v)
    return f if float(f) >= v else np.nextafter(f, np.float32(np.inf))  # compared in float64


@pytest.mark.parametrize("arithmetic", [False, True, "cast"],
                         ids=["bucketize", "arithmetic", "cast"])
@pytest.mark.parametrize("fmt", VIEWS)
def test_format_view_thresholds_are_the_casts_ties(fmt: str, arithmetic: bool | str,
                                                   device: str) -> None:
    """At the two edges themselves (the overflow tie, or the first float32 past it where the
    tie rounds to max; the underflow tie) and one float32 ulp inside them, both trees agree,
    and the edges are counted, the insides not; the specials (+-inf, NaNs of both signs, +-0,
    the largest finite) too."""
    overflow, underflow = thresholds(get_format(fmt))
    overflow = _first_float32_at_or_above(overflow)
    inside = [np.nextafter(np.float32(overflow), np.float32(0)),
              np.nextafter(np.float32(underflow), np.float32(1))]
    specials = [np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, np.finfo(np.float32).max]
    x = np.array([overflow, -overflow, underflow, -underflow, *inside, *specials], np.float32)
    ref, got = count_rows(x, fmt, device, arithmetic)
    assert_claim("numerics.format_view", actual=got, expected=ref, context=fmt)
    assert ref[COLUMNS.index("over_max")] == 3 and ref[COLUMNS.index("to_zero")] == 2


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
@settings(examples(40))
@given(data=st.data())
def test_the_cast_counts_clean_and_unclean_tensors_as_the_reference_does(
        fmt: str, data: st.DataObject, device: str) -> None:
    """The detector's count_table over several tensors at once: the clean ones counted by
    their magnitude's extremes (zeros of both signs, values the cast makes zero, no
    special), the others (a special, a value the cast makes inf, finite values whose sum
    overflows) recounted by the bucket pass; every row is the reference's (NOTE [ Counting
    by the magnitude's extremes ] in torch_impl/numerics_extremes.py)."""
    import torch

    from common.format_spec import get_format as ref_format
    from reference import numerics as ref_numerics
    from torch_impl import numerics as t_numerics
    from torch_impl import numerics_extremes as t_numerics_extremes
    from torch_impl.format_spec import get_format as t_format

    underflow = thresholds(ref_format(fmt))[1] if fmt != "float32" else None
    tiny = [0.0, -0.0, 1.0, -2.5, 1e-30, -1e-40, np.float32(underflow or 1e-45)]
    clean = st.lists(st.sampled_from(tiny) | st.floats(-60000, 60000, width=32),
                     min_size=1, max_size=40)
    # tiled to CAST_FROM values and past, so their extremes count them; one stays small
    big = t_numerics_extremes.CAST_FROM + data.draw(st.integers(0, 3))
    arrays = [np.resize(np.array(data.draw(clean), np.float32), big)
              for _ in range(data.draw(st.integers(1, 3)))]
    arrays.append(np.array(data.draw(clean), np.float32))  # the bucket pass, beside them
    arrays.append(np.resize(data.draw(float32_arrays("float16" if fmt == "float32" else fmt)),
                            big))
    arrays.append(np.full(big, np.finfo(np.float32).max, np.float32))  # the sum overflows
    ref = ref_numerics.count_rows(arrays, ref_format(fmt)).tolist()
    got = t_numerics.count_table([torch.from_numpy(a).to(device) for a in arrays],
                                 t_format(fmt).dtype)
    zero_made = sum(row[COLUMNS.index("to_zero")] for row in ref[:-3])
    if zero_made:
        event(f"{fmt}: a clean tensor holds values the cast makes zero")
    assert_claim("numerics.format_view", actual=np.array(got), expected=np.array(ref),
                 context=f"{fmt} {arrays!r}")


@pytest.mark.parametrize("fmt", VIEWS)
def test_format_view_thresholds_are_ml_dtypes_casts(fmt: str) -> None:
    """A third, independent cast: ml_dtypes (never saturating: inf or NaN past the range)
    takes exactly the float32 values at or above the reference's overflow threshold past the
    range, and makes exactly those at or below its underflow threshold zero, in a band of
    float32 ulps around each edge and at the tie itself."""
    import ml_dtypes

    target = np.float16 if fmt == "float16" else getattr(ml_dtypes, fmt)
    f = get_format(fmt)
    overflow, underflow = thresholds(f)
    tie = f.max + 2.0 ** (f.emax - f.mantissa_bits - 1)  # where to look: max + ulp(max)/2
    edges = [np.float32(tie), np.float32(underflow)]
    steps = np.arange(-3, 4, dtype=np.int32)
    x = np.concatenate([(e.view(np.int32) + steps).view(np.float32) for e in edges])
    with np.errstate(over="ignore"):  # past the range on purpose
        cast = x.astype(target).astype(np.float32)
    wide = x.astype(np.float64)  # a float32 array beside a Python float compares in float32
    assert np.array_equal(~np.isfinite(cast), wide >= overflow), (fmt, x, cast)
    assert np.array_equal(cast == 0, wide <= underflow), (fmt, x, cast)


@pytest.mark.parametrize("fmt", VIEWS)
def test_input_ranges_count_the_same_values_beyond_the_range(fmt: str, device: str) -> None:
    """The first-invalid report's `beyond` (finite inputs past the view format's range) is
    the same in both trees for every view, at the overflow edge and one float32 ulp inside."""
    import torch

    from reference import numerics as ref_numerics
    from torch_impl import numerics as t_numerics
    from torch_impl.format_spec import get_format as t_format

    edge = _first_float32_at_or_above(thresholds(get_format(fmt))[0])
    inside = np.nextafter(edge, np.float32(0))
    x = np.array([edge, -edge, inside, -inside, np.inf, np.nan, 1.0], np.float32)
    ref = ref_numerics.input_range("input", x, get_format(fmt))
    got = t_numerics.input_range("input", torch.from_numpy(x).to(device), t_format(fmt).dtype)
    assert ref.beyond == 2 and got == ref, (fmt, got, ref)


# the edges of each view in a value's own format: the values around them, pattern by pattern
_WIDE = ("float16", "bfloat16", "float32", "float64")


def _edge_values(wide: str, fmt: str) -> np.ndarray:
    """Float64 values exact in `wide`: within two bit patterns of the view's overflow and
    underflow ties (reference thresholds, rounded into `wide`), of `wide`'s largest finite
    and smallest subnormal, of 1; zeros, infs and NaNs; both signs."""
    import torch

    dtype = getattr(torch, wide)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    overflow, underflow = thresholds(get_format(fmt))
    finfo = torch.finfo(dtype)
    centres = torch.tensor([overflow, underflow, finfo.max, finfo.smallest_normal * finfo.eps,
                            1.0], dtype=torch.float64).to(dtype).view(bits)
    near = (centres[:, None] + torch.arange(-2, 3, dtype=bits)).reshape(-1)
    near = near[near >= 0].view(dtype).to(torch.float64)  # positive patterns: inf, NaNs too
    specials = torch.tensor([0.0, np.inf, np.nan], dtype=torch.float64)
    values = torch.cat([near, specials])
    return torch.cat([values, -values]).numpy()


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float32"])
@settings(examples(8), deadline=None)
@given(data=st.data())
def test_the_magnitude_extremes_count_every_edge_class_as_the_bucket_pass(
        fmt: str, data: st.DataObject, device: str) -> None:
    """count_table's large tensors (NOTE [ Counting by the magnitude's extremes ] in
    torch_impl/numerics_extremes.py), read tensor by tensor or all at once, give the rows of
    the readable bucket pass (NOTE [ One pass of counting ]) and of the reference, for values
    of each floating type at every edge class: +-0, the view's underflow and overflow ties
    and the patterns beside them, subnormals, the largest finite, +-inf, NaNs; tensors that
    are clean, that reach an edge, that are not clean, and one seen twice; large ones and
    small ones (below EXTREMES_FROM: tested together, `_small_rows`)."""
    import torch

    from common.format_spec import get_format as ref_format
    from reference import numerics as ref_numerics
    from torch_impl import numerics_counts as t_counts
    from torch_impl import numerics_extremes as t_extremes
    from torch_impl.format_spec import get_format as t_format

    tensors, wides = [], []
    for _ in range(data.draw(st.integers(1, 4))):
        wide = data.draw(st.sampled_from(_WIDE))
        edges = _edge_values(wide, fmt)
        finite = edges[np.isfinite(edges) & (np.abs(edges) < thresholds(get_format(fmt))[0])]
        pool = edges if data.draw(st.booleans()) else finite  # finite: mostly clean tensors
        picked = data.draw(st.lists(st.sampled_from(sorted(pool.tolist(), key=str)),
                                    min_size=1, max_size=8))
        # large: counted by its own extremes; small: with the other small ones, together
        size = t_extremes.EXTREMES_FROM if data.draw(st.booleans()) else len(picked)
        filler = np.full(size + data.draw(st.integers(0, 3)), 1.5)
        filler[:len(picked)] = picked  # one value of the class at least, in range otherwise
        tensors.append(torch.from_numpy(filler).to(getattr(torch, wide)).to(device))
        wides.append(wide)
    tensors.append(tensors[0])  # the same values twice: counted once, reported twice
    wides.append(wides[0])
    view = t_format(fmt).dtype
    readable = t_counts.rows(*t_counts.bucket_counts(tensors, view))
    for each in (True, False):
        got = t_extremes.count_table(tensors, view, each=each)
        assert_claim("numerics.format_view", actual=np.array(got), expected=np.array(readable),
                     context=f"{fmt} each={each} {wides} {[t.tolist()[:8] for t in tensors]}")
    # the reference counts exact values; torch's float64 cast may round twice: float64 aside
    kept = [i for i, w in enumerate(wides) if w != "float64"]
    ref = ref_numerics.count_rows([tensors[i].double().cpu().numpy() for i in kept],
                                  ref_format(fmt))
    kept_rows = np.array([readable[i] for i in kept], np.int64).reshape(ref.shape)
    assert_claim("numerics.format_view", actual=kept_rows, expected=ref, context=f"{fmt} {wides}")
    if any(row[COLUMNS.index("to_zero")] for row in readable):
        event(f"{fmt}: a tensor holds values the view makes zero")


def test_the_magnitude_extremes_read_the_host_once_off_the_cpu(device: str) -> None:
    """count_table with `each` off (every device but the CPU) makes no .item()/bool() read
    (no aten._local_scalar_dense) for clean large tensors, even ones that reach the
    underflow edge: one .tolist() brings every row; with `each` on (the CPU) it reads."""
    import torch

    from parity.lab.your_trainer.host_reads import HostReads
    from torch_impl import numerics_counts as t_counts
    from torch_impl import numerics_extremes as t_extremes

    x = torch.linspace(-2, 2, t_extremes.EXTREMES_FROM, device=device)
    tensors = [x, x * 1e-9, torch.zeros_like(x)]  # clean; at the underflow edge; zeros
    readable = t_counts.rows(*t_counts.bucket_counts(tensors, torch.float16))
    for each, reads in ((False, 0), (True, 2 * len(tensors))):
        with HostReads() as mode:
            got = t_extremes.count_table(tensors, torch.float16, each=each)
        assert got == readable
        seen = sum(mode.sites.values())
        assert (seen == 0) if reads == 0 else (seen >= reads)


def test_small_tensors_of_the_same_sizes_in_another_type_count_alike(device: str) -> None:
    """The small tensors' joint count (`_small_rows`) keeps its per-value tensor index per
    size list AND integer type: the same sizes promoted to float32, then float64, then
    float32 again, each reach the underflow edge and give the bucket pass's rows (a segment
    kept across types wrapped past int32: bincount asked for 4e18 slots)."""
    import torch

    from torch_impl import numerics_counts as t_counts
    from torch_impl import numerics_extremes as t_extremes

    for dtype in (torch.float32, torch.float64, torch.float32):
        tensors = [torch.linspace(-1, 1, n, dtype=dtype, device=device) * 1e-9
                   for n in (10, 20)]
        readable = t_counts.rows(*t_counts.bucket_counts(tensors, torch.float16))
        got = t_extremes.count_table(tensors, torch.float16)
        assert_claim("numerics.format_view", actual=np.array(got), expected=np.array(readable),
                     context=f"{dtype}")
        assert any(row[COLUMNS.index("to_zero")] for row in readable), "no edge reached"
