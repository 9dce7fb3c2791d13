"""fp8 scaling in both trees: current scaling (fp8_scaling.current_trees) and TE's delayed
update step after step (fp8_scaling.delayed_trees) for any input, TE's kernel worked by hand
(fp8_scaling.te_vectors), the margin's two orders (fp8_scaling.margin_order), the inf
freeze (fp8_scaling.inf_freeze) and the clamp's independence of the cast's overflow policy
(fp8_scaling.saturation). torchao, the oracle of current scaling:
parity/test_fp8_scaling_torchao.py. Driver: parity/drivers/fp8_scaling.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from common.fp8_recipes import recipe_format
from parity.compare import assert_claim
from parity.drivers import fp8_scaling as drv
from parity.strategies import examples, fp8_histories, fp8_tensors
from reference import fp8_scaling as rfp8
from torch_impl import fp8_scaling as tfp8

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
FLT_MAX = float.fromhex("0x1.fffffep127")
NAN, INF = float("nan"), float("inf")


def test_rowwise_current_scaling_casts_to_the_same_e4m3_bits_in_both_trees(device: str) -> None:
    """Rowwise current scaling of one tensor to float8_e4m3fn: both trees' amaxes, scales and
    fp8 data are the same bits."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 8)) * 2.0 ** rng.integers(-12, 12, (4, 1))).astype(np.float32)
    ref_amax = rfp8.tensor_amax(x, axis=-1)  # (4, 1)
    torch_amax = tfp8.tensor_amax(torch.from_numpy(x).to(device), axis=-1)  # (4, 1)
    ref_scale = rfp8.amax_to_scale(ref_amax, E4M3)  # (4, 1) float32
    torch_scale = tfp8.amax_to_scale(torch_amax, E4M3)  # (4, 1) float32
    ref_data = rfp8.cast_to_fp8(x, ref_scale, E4M3)  # (4, 8) float8_e4m3fn
    torch_data = tfp8.cast_to_fp8(torch.from_numpy(x).to(device), torch_scale, E4M3)  # (4, 8)
    assert_claim("fp8_scaling.current_trees", actual=torch_scale, expected=ref_scale,
                 context="scale")
    assert_claim("fp8_scaling.current_trees", actual=torch_data, expected=ref_data,
                 context="data")


@given(case=fp8_tensors())
@settings(examples(60))
def test_current_scaling_gives_the_same_data_and_scales_in_both_trees(case: tuple,
                                                                      device: str) -> None:
    """Any float32 tensor, any format, tensorwise or rowwise, with or without power-of-2
    scales: both trees' fp8 data and scales agree (NaN as a class)."""
    x, fmt, axis, power_of_2 = case
    (ref_data, ref_scale), (t_data, t_scale) = drv.current(x, fmt, axis, power_of_2, device)
    amax = np.max(np.abs(x), axis=axis)
    event(f"amax has NaN: {bool(np.isnan(amax).any())}, inf: {bool(np.isinf(amax).any())}, "
          f"zero: {bool((amax == 0).any())}")
    context = f"{fmt} axis={axis} power_of_2={power_of_2}"
    assert_claim("fp8_scaling.current_trees", actual=t_scale, expected=ref_scale,
                 context=context + " scale")
    assert_claim("fp8_scaling.current_trees", actual=t_data, expected=ref_data,
                 context=context + " data")


@given(case=fp8_histories())
@settings(examples(60))
def test_delayed_updates_give_the_same_histories_and_scales_in_both_trees(case: dict,
                                                                          device: str) -> None:
    """Step after step (record the amax, update), both orders: the same bits in both trees."""
    for order in ("kernel", "python"):
        args = (case["history"], case["scale"], case["amaxes"], case["fmt"], case["margin"],
                case["algo"], order)
        ref_h, ref_s = drv.delayed_run(*args)
        t_h, t_s = drv.delayed_run(*args, tree="torch", device=device)
        for step, (a, b, c, d) in enumerate(zip(t_h, ref_h, t_s, ref_s, strict=True)):
            context = f"{case['fmt']} {case['algo']} m={case['margin']} {order} step {step}"
            assert_claim("fp8_scaling.delayed_trees", actual=a, expected=b,
                         context=context + " history")
            assert_claim("fp8_scaling.delayed_trees", actual=c, expected=d,
                         context=context + " scale")
    held = any(np.array_equal(s, case["scale"]) for s in ref_s)
    event(f"{case['algo']}: a scale was held: {held}")


def _both_trees_update(history: list[list[float]], scale: list[float], fmt: str, margin: int,
                       algo: str, order: str = "kernel") -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    from reference import fp8_scaling as rfp8
    from torch_impl import fp8_scaling as tfp8

    h, s = np.array(history, np.float32), np.array(scale, np.float32)
    th, ts = tfp8.delayed_update(torch.from_numpy(h), torch.from_numpy(s), fmt, margin, algo,
                                 order)
    return [rfp8.delayed_update(h, s, fmt, margin, algo, order), (th.numpy(), ts.numpy())]


# TE's kernel (delayed_scaling.cu, kernel_bulk) worked by hand: (case, history (L, 1) with
# slot 0 the newest amax, previous scale, fmt, margin, algo, order, expected history,
# expected scale). 448 = 7 * 2^6 and 57344 = 7 * 2^13, so every quotient below is exact.
TE_VECTORS = [
    # roll: [4, 2, 1] -> rolled [2, 1, 4], slot 0 zeroed; max 4: 448 / 4 = 112
    ("finite amax", [[4], [2], [1]], [1], E4M3, 0, "max", "kernel", [[0], [1], [4]], [112]),
    # the newest amax is 1 but the history's max is 8: max 448 / 8 = 56, most_recent 448 / 1
    ("max of the window", [[1], [2], [8]], [1], E4M3, 0, "max", "kernel", [[0], [8], [1]], [56]),
    ("most recent", [[1], [2], [8]], [1], E4M3, 0, "most_recent", "kernel", [[0], [8], [1]],
     [448]),
    # margin 2: scaled_max = 448 * 2^-2 = 112; 112 / 7 = 16
    ("margin", [[7]], [1], E4M3, 2, "max", "kernel", [[0]], [16]),
    # slot 0 is 0 (nothing recorded): the kernel rolls nothing and keeps the scale, though
    # the window holds 8 (TE's unfused python update would roll and give 448 / 8 = 56)
    ("zero slot 0", [[0], [8], [4]], [3], E4M3, 0, "max", "kernel", [[0], [8], [4]], [3]),
    # inf rolls in; the window's max is inf, not finite: the scale 5 is kept
    ("inf amax", [[INF], [2]], [5], E4M3, 0, "max", "kernel", [[0], [INF]], [5]),
    # NaN != 0, so it rolls in, but fmaxf(2, NaN) = 2: 448 / 2 = 224
    ("NaN skipped by max", [[NAN], [2]], [5], E4M3, 0, "max", "kernel", [[0], [NAN]], [224]),
    # most_recent takes the NaN itself: not finite, the scale 5 is kept
    ("NaN most recent", [[NAN], [2]], [5], E4M3, 0, "most_recent", "kernel", [[0], [NAN]], [5]),
    # 448 / 2^-149 = 7 * 2^155 overflows float32: FLT_MAX
    ("scale overflows", [[2.0**-149]], [1], E4M3, 0, "max", "kernel", [[0]], [FLT_MAX]),
    # margin 30: (448 * 2^-30) / 2^-149 = 7 * 2^-24 * 2^149 = 7 * 2^125, finite ...
    ("tiny amax, margin", [[2.0**-149]], [1], E4M3, 30, "max", "kernel", [[0]], [7 * 2.0**125]),
    # ... while the docstring's (448 / 2^-149) / 2^30 overflows first: FLT_MAX
    ("tiny amax, python order", [[2.0**-149]], [1], E4M3, 30, "max", "python", [[0]], [FLT_MAX]),
    # HYBRID: backward tensors in e5m2, 57344 / 7 = 8192; forward in e4m3, 448 / 7 = 64
    ("HYBRID backward", [[7]], [1], recipe_format("HYBRID", False), 0, "max", "kernel", [[0]],
     [8192]),
    ("HYBRID forward", [[7]], [1], recipe_format("HYBRID", True), 0, "max", "kernel", [[0]], [64]),
]


@pytest.mark.parametrize("vector", TE_VECTORS, ids=[v[0] for v in TE_VECTORS])
def test_te_kernel_cases_worked_by_hand_in_both_trees(vector: tuple) -> None:
    """Each hand-worked case of TE's update: both trees give its history and scale."""
    name, history, scale, fmt, margin, algo, order, want_history, want_scale = vector
    expected_h = np.array(want_history, np.float32)
    expected_s = np.array(want_scale, np.float32)
    for tree, (h, s) in zip(("reference", "torch"), _both_trees_update(
            history, scale, fmt, margin, algo, order), strict=True):
        # a NaN copied from the input keeps its bits: compare bits, the NaN written the same way
        assert_claim("fp8_scaling.te_vectors", actual=h, expected=expected_h,
                     context=f"{name} {tree} history")
        assert_claim("fp8_scaling.te_vectors", actual=s, expected=expected_s,
                     context=f"{name} {tree} scale")


def _parts(amax: np.ndarray, fmt: str, margin: int, device: str) -> np.ndarray:
    """Where the kernel and python orders differ, both trees held to each order's bits."""
    kernel, python = drv.margin_scales(amax, fmt, margin)
    t_kernel, t_python = drv.margin_scales(amax, fmt, margin, "torch", device)
    assert_claim("fp8_scaling.margin_order", actual=t_kernel, expected=kernel,
                 context=f"{fmt} m={margin} kernel")
    assert_claim("fp8_scaling.margin_order", actual=t_python, expected=python,
                 context=f"{fmt} m={margin} python")
    parts = kernel.view(np.uint32) != python.view(np.uint32)
    assert np.all(python[parts] == np.float32(FLT_MAX)), "the python order overflowed there"
    return parts


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_margin_orders_part_only_where_the_docstring_quotient_overflows(fmt: str,
                                                                       device: str) -> None:
    """At margin 1 the orders differ on one run of float32 amaxes, from fp8_max / 2 /
    FLT_MAX up to fp8_max / FLT_MAX, 2^23 - 1 of them: every amax within 4,096 ulps of both
    ends, and every 257th of the run and of a binade either side of it; at margin 0 nowhere.
    (Every float32 amax: the slow test below.)"""
    fp8_max = drv.get_format(fmt).max
    ends = [np.float32(fp8_max / 2 / FLT_MAX).view(np.uint32),
            np.float32(fp8_max / FLT_MAX).view(np.uint32)]
    found = []
    for end in ends:
        bits = np.arange(end - 4096, end + 4096, dtype=np.uint32)
        parts = _parts(bits.view(np.float32), fmt, 1, device)
        switch = np.flatnonzero(parts[1:] != parts[:-1])
        assert switch.size == 1, f"one switch near each end, got {switch.size}"
        found.append(int(bits[switch[0] + 1]))  # the first amax past the switch
    lo, hi = found  # differing: [lo, hi)
    inside = np.arange(lo, hi, 257, dtype=np.uint32)
    outside = np.concatenate([np.arange(lo - 2**23, lo, 257, dtype=np.uint32),
                              np.arange(hi, hi + 2**23, 257, dtype=np.uint32)])
    assert np.all(_parts(inside.view(np.float32), fmt, 1, device))
    assert not np.any(_parts(outside.view(np.float32), fmt, 1, device))
    assert hi - lo == 2**23 - 1, (lo, hi)
    sample = np.concatenate([inside, outside]).view(np.float32)
    assert not np.any(_parts(sample, fmt, 0, device)), "margin 0: the orders never part"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_margin_orders_over_every_positive_float32_amax(fmt: str) -> None:
    """All 2^31 - 2^23 positive finite float32 amaxes (chunks of 2^24): margin 0 never
    differs, margin 1 on exactly 2^23 - 1 amaxes."""
    from reference import fp8_scaling as rfp8

    one = np.float32(1)
    for margin, differing in ((0, 0), (1, 2**23 - 1)):
        count = 0
        for start in range(1, 0x7F800000, 1 << 24):
            bits = np.arange(start, min(start + (1 << 24), 0x7F800000), dtype=np.uint32)
            a = bits.view(np.float32)
            k = rfp8.delayed_scale(a, one, fmt, margin, "kernel")
            p = rfp8.delayed_scale(a, one, fmt, margin, "python")
            count += int(np.count_nonzero(k.view(np.uint32) != p.view(np.uint32)))
        assert count == differing, (fmt, margin, count)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_an_infinite_amax_freezes_the_delayed_scale_for_the_history_length(
        algo: str, length: int, device: str) -> None:
    """amaxes 2, 4, inf, then 1s, then 8: the scale 448 / 4 = 112 is held for exactly L
    updates under 'max' (1 under 'most_recent'), then 448 / 1; both trees, bit for bit."""
    steps = 3 + length + 2
    amaxes = np.ones((steps, 1), np.float32)
    amaxes[0], amaxes[1], amaxes[2], amaxes[-1] = 2, 4, np.inf, 8
    history, scale = np.zeros((length, 1), np.float32), np.ones(1, np.float32)
    ref_h, ref_s = drv.delayed_run(history, scale, amaxes, E4M3, 0, algo)
    t_h, t_s = drv.delayed_run(history, scale, amaxes, E4M3, 0, algo, tree="torch",
                               device=device)
    for step in range(steps):
        assert_claim("fp8_scaling.inf_freeze", actual=t_s[step], expected=ref_s[step],
                     context=f"L={length} {step}")
        assert_claim("fp8_scaling.inf_freeze", actual=t_h[step], expected=ref_h[step],
                     context=f"L={length} {step}")
    scales = [float(s[0]) for s in ref_s]
    frozen = sum(1 for s in scales[2:] if s == 112.0)  # the updates from the inf's step on
    assert frozen == (length if algo == "max" else 1), scales
    assert scales[:2] == [224.0, 112.0], scales  # 448 / 2, 448 / 4
    assert scales[2 + frozen] == 448.0, scales  # the window holds only 1s again: 448 / 1
    assert scales[-1] == 56.0, scales  # 448 / 8


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_the_clamp_makes_the_cast_independent_of_the_overflow_policy(fmt: str,
                                                                    device: str) -> None:
    """The tie above max, max + ulp, inf, -inf after scaling: the recipe's codes are those of
    every overflow policy, in both trees; the installed torch's raw cast is checked to do
    what its version implies (e4m3: saturating from 2.13, NaN before; e5m2: inf, the tie
    included, since it rounds to the even 2^16)."""
    r = drv.saturation(fmt, device=device)
    assert_claim("fp8_scaling.saturation", actual=r["recipe_torch"], expected=r["recipe_reference"],
                 context=fmt)
    for policy, codes in r["policies"].items():
        assert_claim("fp8_scaling.saturation", actual=r["recipe_torch"], expected=codes,
                     context=f"{fmt} {policy}")
    overflowing = np.abs(r["scaled"]) > r["max"]
    raw = r["raw"].astype(np.float32)
    if fmt == E5M2:
        assert np.all(np.isinf(raw[overflowing])), (r["torch"], raw)
    elif r["saturates"]:
        assert np.all(np.abs(raw[overflowing][1:]) == 448), (r["torch"], raw)
    else:
        assert np.all(np.isnan(raw[overflowing][1:])), (r["torch"], raw)
    assert np.all(np.abs(r["recipe_torch"][overflowing].astype(np.float32)) == r["max"])
    assert np.any(overflowing), "guard: some products overflow the format"


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_delayed_scale_at_the_edges_of_the_declared_margin_range_in_both_trees(
        fmt: str, device: str) -> None:
    """Every margin the argument check accepts gives the same scale bits in both trees, in
    both orders, at the range's edges and around 2^63 (where a Python int 2**margin stopped
    fitting torch's int64); one past each edge is the same one-line error in both."""
    import torch

    from common.fp8_recipes import MARGINS
    from reference import fp8_scaling as rfp8
    from torch_impl import fp8_scaling as tfp8

    amax = np.array([3.0, 2.0**-140, 6.5e4, 1e30], np.float32)
    scale = np.ones(4, np.float32)
    for margin in (MARGINS[0], -64, -1, 0, 1, 63, 64, MARGINS[-1]):
        for order in ("kernel", "python"):
            ref_scale = rfp8.delayed_scale(amax, scale, fmt, margin, order)
            torch_scale = tfp8.delayed_scale(torch.from_numpy(amax).to(device),
                                             torch.from_numpy(scale).to(device), fmt, margin,
                                             order)
            assert_claim("fp8_scaling.delayed_trees", actual=torch_scale,
                         expected=ref_scale, context=f"margin {margin} {order}")
    for margin in (MARGINS[0] - 1, MARGINS[-1] + 1):
        errors = []
        for tree, a, s in ((rfp8, amax, scale), (tfp8, torch.from_numpy(amax),
                                                 torch.from_numpy(scale))):
            with pytest.raises(ValueError) as e:
                tree.delayed_scale(a, s, fmt, margin)
            errors.append(str(e.value))
        assert errors[0] == errors[1] and str(margin) in errors[0]


# one past an edge of each declared range, as (function, reference args, torch args): the
# arrays are the same values in each tree's type
_A = np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)
_S = np.ones(2, np.float32)
BAD_EDGES = {
    "axis past the last": ("tensor_amax", (_A,), {"axis": 2}),
    "an empty tensor": ("tensor_amax", (np.zeros((0,), np.float32),), {}),
    "an unknown order": ("delayed_scale", (_S, _S, "float8_e4m3fn", 0, "fused"), {}),
    "an unknown algo": ("delayed_update", (_A, _S, "float8_e4m3fn", 0, "mean"), {}),
    "a history of length 0": ("delayed_update", (np.zeros((0, 2), np.float32), _S,
                                                 "float8_e4m3fn"), {}),
    "a scale of another shape": ("delayed_update", (_A, np.ones(3, np.float32),
                                                    "float8_e4m3fn"), {}),
    "a margin past the range": ("delayed_update", (_A, _S, "float8_e4m3fn", 101), {}),
    "a format that is not fp8": ("amax_to_scale", (_S, "float16"), {}),
}


@pytest.mark.parametrize("case", list(BAD_EDGES))
def test_one_past_each_declared_edge_is_the_same_one_line_error_in_both_trees(case: str
                                                                              ) -> None:
    """Every argument range the checks declare, one step outside it: both trees refuse
    with the same ValueError line."""
    name, args, kwargs = BAD_EDGES[case]
    lines = []
    for tree, wrap in ((rfp8, lambda a: a), (tfp8, torch.from_numpy)):
        given_args = tuple(wrap(a) if isinstance(a, np.ndarray) else a for a in args)
        with pytest.raises(ValueError) as refused:
            getattr(tree, name)(*given_args, **kwargs)
        lines.append(str(refused.value))
    assert lines[0] == lines[1] and "\n" not in lines[0], lines


@pytest.mark.parametrize("length", [1, 2, 1024])
def test_a_history_of_any_length_updates_alike_in_both_trees(length: int) -> None:
    """History lengths at the declared range's lower edge (1) and far past TE's default
    (1024): the same history and scale bits from both trees."""
    rng = np.random.default_rng(length)
    history = (rng.random((length, 3)) * 2.0 ** rng.integers(-20, 20, (length, 3))).astype(
        np.float32)
    scale = np.ones(3, np.float32)
    ref = rfp8.delayed_update(history, scale, "float8_e4m3fn")
    tor = tfp8.delayed_update(torch.from_numpy(history), torch.from_numpy(scale),
                              "float8_e4m3fn")
    assert_claim("fp8_scaling.delayed_trees", actual=tor[0], expected=ref[0],
                 context=f"history, L = {length}")
    assert_claim("fp8_scaling.delayed_trees", actual=tor[1], expected=ref[1],
                 context=f"scale, L = {length}")
