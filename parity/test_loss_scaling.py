"""Parity of reference loss scaling (loss_scale_kernels, loss_scaling, clip_grad) with
torch.amp.GradScaler, torch.nn.utils.clip_grad and each tree's train.train_step.

The kernels one call at a time (scale update, unscale), the scaler state machine driving both
scalers with one gradient stream, clipping with a given norm and end to end, the float16
underflow fault, and synced training runs that clip. Drivers: parity/drivers/loss_scaling.py,
parity/drivers/loss_scaling_train.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from parity.claims import loss_scaling as lsc
from parity.compare import assert_claim
from parity.drivers.loss_scaling import (
    ScalerStreams,
    clip_pair,
    clipped_scale,
    norm_scale,
    special_grads,
    underflow_grads,
    unscale_pair,
    update_pair,
)
from parity.drivers.loss_scaling_train import loss_reduction, synced_steps
from parity.drivers.optim import FUSED
from parity.strategies import examples, scaler_factors, scaler_scales
from parity.strategies.loss_scaling import clip_grad_lists, clip_norms
from reference import loss_scaling as rls
from reference import optim as ropt
from reference.nn import Parameter
from torch_impl import loss_scaling as tls


def test_scaler_steps_match_torch_gradscaler_bitwise(device: str) -> None:
    """Four SGD steps through a GradScaler, the third with an inf gradient: the reference and
    torch.amp.GradScaler hold the same scale, skip and parameter bits after every step."""
    rng = np.random.default_rng(0)
    init = rng.standard_normal((3, 4)).astype(np.float32)  # (3, 4)
    grads = rng.standard_normal((4, 3, 4)).astype(np.float32)  # (steps, 3, 4)
    grads[2, 1, 0] = np.inf  # step 2 overflows: skipped, scale backs off
    ref_p = Parameter(init.copy())
    torch_p = torch.nn.Parameter(torch.from_numpy(init.copy()).to(device))
    ref_opt = ropt.SGD([ref_p], lr=0.5, fma=FUSED)
    torch_opt = torch.optim.SGD([torch_p], lr=0.5)
    ref_scaler = rls.GradScaler(init_scale=2.0**4, growth_interval=1)
    torch_scaler = tls.GradScaler(torch.device(device).type, init_scale=2.0**4,
                                  growth_interval=1)
    ref_seen, torch_seen = [], []
    for g in grads:
        ref_p.grad = ref_scaler.scale(g)  # the backward of a scaled loss: S g
        torch_p.grad = torch_scaler.scale(torch.from_numpy(g).to(device))
        ref_scaler.step(ref_opt)
        torch_scaler.step(torch_opt)
        ref_seen.append([rls.step_skipped(ref_scaler, ref_opt), ref_scaler.get_scale()])
        torch_seen.append([tls.step_skipped(torch_scaler, torch_opt),
                           torch_scaler.get_scale()])
        ref_scaler.update()
        torch_scaler.update()
    assert ref_seen[2][0] and ref_seen[3][1] < ref_seen[2][1]  # the skip and backoff reached
    assert_claim("loss_scaling.scaler", actual=np.array(torch_seen), expected=np.array(ref_seen))
    assert_claim("loss_scaling.scaler", actual=torch_p.detach(), expected=ref_p.data)


@given(scale=scaler_scales(), factors=scaler_factors(), found_inf=st.booleans(),
       growth_interval=st.integers(-1, 5), tracker=st.integers(0, 6))
def test_update_rule_matches_torch_kernel_bitwise(scale: float, factors: tuple[float, float],
                                                  found_inf: bool, growth_interval: int,
                                                  tracker: int, device: str) -> None:
    """One update from any state gives torch._amp_update_scale_'s scale bits and tracker."""
    a, b = update_pair(scale, tracker, float(found_inf), *factors, growth_interval, device)
    event("grew" if b[0] > np.float32(scale).view(np.int32) else "did not grow")
    assert_claim("loss_scaling.update_rule", actual=b, expected=a)


def test_update_rule_caps_growth_and_collapses_to_zero_like_torch(device: str) -> None:
    """At float32 max growth is dropped; repeated backoff from the smallest subnormal gives 0,
    and an infinite growth of that 0 (NaN) is dropped too, without a warning;
    the scale grows on the growth_interval-th finite step, not one before or after."""
    big = float(np.finfo(np.float32).max) / 1.5
    a, b = update_pair(big, 0, 0.0, 2.0, 0.5, 1, device)
    assert_claim("loss_scaling.update_rule", actual=b, expected=a,
                 context="growth past float32 max")
    assert a[0] == np.float32(big).view(np.int32) and a[1] == 0
    tiny = float(np.float32(2.0**-149))
    a, b = update_pair(tiny, 0, 1.0, 2.0, 0.5, 1, device)
    assert_claim("loss_scaling.update_rule", actual=b, expected=a,
                 context="backoff below the smallest subnormal")
    assert a[0] == 0
    a, b = update_pair(0.0, 0, 0.0, math.inf, 0.5, 1, device)  # 0 * inf: NaN, dropped
    assert_claim("loss_scaling.update_rule", actual=b, expected=a,
                 context="a scale of 0 grown by an infinite factor")
    assert a[0] == 0
    for tracker, grows in ((2, False), (3, True)):  # growth_interval 4: the 4th success grows
        a, b = update_pair(1024.0, tracker, 0.0, 2.0, 0.5, 4, device)
        assert_claim("loss_scaling.update_rule", actual=b, expected=a,
                     context=f"tracker {tracker} of interval 4")
        assert bool(a[0] == np.float32(2048.0).view(np.int32)) is grows


@given(scale=scaler_scales(), seed=st.integers(0, 2**32 - 1))
def test_unscale_matches_torch_kernel_bitwise_for_any_scale(scale: float, seed: int,
                                                            device: str) -> None:
    """float16/32/64 gradients with inf/NaN: same unscaled bits and found_inf as torch's kernel."""
    rng = np.random.default_rng(seed)
    grads = [special_grads(rng, (int(rng.integers(0, 40)),), dt)
             for dt in (np.float32, np.float64, np.float16)]
    a, b, found_a, found_b = unscale_pair(grads, scale, device)
    event(f"found_inf={found_b}")
    assert found_a == found_b
    for x, y in zip(a, b, strict=True):
        assert_claim("loss_scaling.unscale", actual=y, expected=x, context=f"{x.dtype}")


class _Asserted(ScalerStreams):
    def judge(self, label: str, a: Any, b: Any) -> None:
        assert_claim("loss_scaling.scaler", actual=b, expected=a, context=label)


def _streams(device: str, count: int) -> None:
    machine = type("Streams", (_Asserted,), {"device": device})
    # a state machine keeps its own budget under every profile (conftest.py)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=count, stateful_step_count=30, deadline=None))


def test_scaler_streams_match_torch_bitwise(device: str) -> None:
    """The state machine (15 streams of up to 30 moves): equal after every move."""
    _streams(device, 15)


@pytest.mark.slow
def test_scaler_streams_match_torch_bitwise_long(device: str) -> None:
    """The state machine with 300 streams of up to 30 moves (run with -m slow)."""
    _streams(device, 300)


@given(grads=clip_grad_lists(), norm=clip_norms(), foreach=st.sampled_from([False, True]))
@example(grads=[np.array([1.0, -2.0, np.inf], np.float32)], norm=float("nan"), foreach=False)
@example(grads=[np.array([1.0, -2.0, np.inf], np.float32)], norm=float("inf"), foreach=True)
@example(grads=[np.array([1.0, -2.0], np.float32)], norm=0.5, foreach=False)
def test_clip_with_a_given_norm_matches_torch_bitwise(grads: list[np.ndarray], norm: float,
                                                      foreach: bool, device: str) -> None:
    """clip_grads_with_norm_ (max_norm 1) leaves torch's bits for any norm, either side of
    the clamp, zero, inf and NaN."""
    _, _, a, b = clip_pair(grads, 1.0, norm, foreach, device)
    coef = 1.0 / (np.float32(norm) + np.float32(1e-6))
    event("clamped to 1" if coef >= 1 else "clipped" if coef < 1 else "NaN coefficient")
    for x, y in zip(a, b, strict=True):
        assert_claim("loss_scaling.clip", actual=y, expected=x, context=f"norm {norm!r}")


def test_clip_edges_are_reached_exactly(device: str) -> None:
    """Around max_norm - 1e-6 the clamp switches; an inf norm zeroes finite gradients and a
    NaN norm makes every gradient NaN: the reference and torch agree on each."""
    g = [np.array([0.5, -2.0, np.inf], np.float32)]
    for norm, expect in ((float(np.float32(1 - 1e-6)), None), (float("inf"), [0.0, -0.0]),
                         (float("nan"), "nan")):
        _, _, a, b = clip_pair(g, 1.0, norm, None, device)
        assert_claim("loss_scaling.clip", actual=b[0], expected=a[0], context=f"norm {norm}")
        if expect == "nan":
            assert np.all(np.isnan(a[0]))
        elif expect is not None:
            assert np.array_equal(a[0][:2], expect) and np.isnan(a[0][2])
    below = float(np.nextafter(np.float32(1 - 1e-6), np.float32(0)))
    _, _, a, _ = clip_pair([np.ones(3, np.float32)], 1.0, below, None, device)
    assert np.array_equal(a[0], np.ones(3)), "below the switch the gradients stay"


@settings(examples(40))
@given(grads=clip_grad_lists(), max_norm=st.sampled_from([1e-3, 0.1, 1.0, 10.0, 1e4]),
       foreach=st.sampled_from([False, True]))
@example(grads=[np.array([1.0, np.nan], np.float32), np.ones(3, np.float32)], max_norm=1.0,
         foreach=False)
@example(grads=[np.array([1.0, np.inf], np.float32), np.ones(3, np.float32)], max_norm=1.0,
         foreach=True)
@example(grads=[np.full(5, 0.1, np.float32)], max_norm=1.0, foreach=False)
def test_clip_grad_norm_within_the_n_term_bound_of_torch(grads: list[np.ndarray],
                                                         max_norm: float, foreach: bool,
                                                         device: str) -> None:
    """Each tree's own norm: norms within eps (n + m + 6)/2 norm, clipped gradients within
    eps (n + m + 16)/2 c|g|, bit-identical where neither clips; with an inf or NaN gradient
    the same non-finite norm and the same clipped bits."""
    ref_norm, t_norm, a, b = clip_pair(grads, max_norm, None, foreach, device)
    if not all(np.all(np.isfinite(g)) for g in grads):  # a non-finite norm: same bits
        event("non-finite")
        assert_claim("loss_scaling.clip", actual=t_norm, expected=ref_norm,
                     context="non-finite total norm")
        for x, y in zip(a, b, strict=True):
            assert_claim("loss_scaling.clip", actual=y, expected=x,
                         context="gradient clipped by a non-finite norm")
        return
    event("clipped" if ref_norm > max_norm else "not clipped")
    assert_claim("loss_scaling.clip_grad_norm", actual=t_norm, expected=ref_norm,
                 context="total norm", scale=norm_scale(grads))
    for x, y, s in zip(a, b, clipped_scale(grads, max_norm), strict=True):
        assert_claim("loss_scaling.clip_grad_norm", actual=y, expected=x,
                     context="clipped gradient", scale=s)


@pytest.mark.parametrize("scale", [1.0, 2.0**16])
def test_fp16_underflow_masks_agree_exactly(scale: float, device: str) -> None:
    """Without scaling, the same gradient elements underflow to 0 in both, layer by layer."""
    pairs = underflow_grads(scale, device=device)
    at_edge = sum(int(np.sum(np.abs(b * np.float32(scale)) == np.float32(2.0**-24)))
                  for _, _, b in pairs)
    for name, a, b in pairs:
        assert_claim("loss_scaling.underflow_mask", actual=b == 0, expected=a == 0, context=name)
    if scale == 1.0:  # guards: the fault is seeded and the edge (2^-24 next to 0) is reached
        assert any(np.any(b == 0) for _, _, b in pairs), "no underflow: the fault was not seeded"
        assert at_edge > 0, "no gradient at the smallest subnormal: the edge was not reached"


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize("recompute", ["none", "uniform:2"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_training_steps_agree_within_the_per_step_bound_and_clip(precision: str,
                                                                 recompute: str,
                                                                 device: str) -> None:
    """Synced steps: equal scale/skip/clip decisions, both branches of clipping reached, the
    loss falls in both trees, parameters within the per-step bound B after every step; with
    and without recomputation under autocast (B is from plain autocast gradients, which a
    recompute leaves bit-identical in each tree)."""
    steps = synced_steps(precision, steps=lsc.TRAIN_STEPS, device=device,
                         max_grad_norm=lsc.TRAIN_MAX_GRAD_NORM, recompute=recompute)
    limit = lsc.TRAIN_MAX_GRAD_NORM
    for i, s in enumerate(steps):
        r, t = s["ref"], s["torch"]
        assert (r.scale, r.skipped, r.grad_norm > limit) == (
            t.scale, t.skipped, t.grad_norm > limit), f"step {i}: {r} vs {t}"
        for (name, a, b), bound in zip(s["params"], s["bounds"], strict=True):
            assert_claim("loss_scaling.train", actual=b, expected=a, context=f"step {i} {name}",
                         scale=bound / 2.0**-23)
    clipped = sum(s["ref"].grad_norm > limit and not s["ref"].skipped for s in steps)
    unclipped = sum(s["ref"].grad_norm <= limit for s in steps)
    assert clipped >= lsc.TRAIN_MIN_CLIPPED and unclipped >= lsc.TRAIN_MIN_UNCLIPPED, (
        f"{clipped} steps clipped, {unclipped} did not: both branches must be reached")
    for side in ("ref", "torch"):
        assert loss_reduction([s[side] for s in steps]) > lsc.TRAIN_MIN_LOSS_REDUCTION, side
    if precision == "fp16":
        assert any(s["ref"].skipped for s in steps), "the fp16 run never overflowed: edge missed"


def test_gpt_fp16_scale_trajectory_and_skipped_steps_match_torch(device: str) -> None:
    """The transformer's fp16 run: the same scale after every step and the same skipped
    steps, in a run that overflows repeatedly and grows its scale in between."""
    from parity.drivers.loss_scaling_gpt import gpt_trajectory

    t = gpt_trajectory(device=device)
    assert_claim("loss_scaling.gpt_trajectory", actual=t.torch_scales, expected=t.ref_scales,
                 context="scales")
    assert_claim("loss_scaling.gpt_trajectory", actual=t.torch_skipped, expected=t.ref_skipped,
                 context="skipped")
    assert t.torch_skipped.sum() >= 2, "the run must overflow at least twice"
    changes = np.diff(np.log2(t.torch_scales))
    assert (changes < 0).any() and (changes > 0).any(), "the scale must back off and grow"
    first_growth = int(np.flatnonzero(changes > 0)[0]) + 1
    assert t.torch_skipped[first_growth + 1:].any(), "a grown scale must overflow again"
