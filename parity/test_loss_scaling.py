"""Parity of reference.loss_scaling with torch.amp.GradScaler and torch_impl.loss_scaling (CPU).

The kernels one call at a time (scale update, unscale), then a hypothesis state machine
driving both scalers with one gradient stream, then whole float16/bfloat16 training runs
and the float16-underflow fault. Drivers are in parity/checks/loss_scaling.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from parity.checks.loss_scaling import (
    ScalerPair,
    loss_reduction,
    special_grads,
    train_runs,
    underflow_grads,
    unscale_pair,
    update_pair,
)
from parity.compare import assert_claim
from parity.strategies import scaler_factors, scaler_grad_stream, scaler_hyper, scaler_scales


@given(scale=scaler_scales(), factors=scaler_factors(), found_inf=st.booleans(),
       growth_interval=st.integers(-1, 5), tracker=st.integers(0, 6))
def test_update_rule_matches_torch_kernel_bitwise(scale: float, factors: tuple[float, float],
                                                  found_inf: bool, growth_interval: int,
                                                  tracker: int) -> None:
    """One update from any state gives torch._amp_update_scale_'s scale bits and tracker."""
    a, b = update_pair(scale, tracker, float(found_inf), *factors, growth_interval)
    event("grew" if b[0] > np.float32(scale).view(np.int32) else "did not grow")
    assert_claim("loss_scaling.update_rule", a, b)


def test_update_rule_caps_growth_and_collapses_to_zero_like_torch() -> None:
    """At float32 max growth is dropped; repeated backoff from the smallest subnormal gives 0."""
    big = float(np.finfo(np.float32).max) / 1.5
    a, b = update_pair(big, 0, 0.0, 2.0, 0.5, 1)
    assert_claim("loss_scaling.update_rule", a, b, "growth past float32 max")
    assert a[0] == np.float32(big).view(np.int32) and a[1] == 0
    tiny = float(np.float32(2.0**-149))
    a, b = update_pair(tiny, 0, 1.0, 2.0, 0.5, 1)
    assert_claim("loss_scaling.update_rule", a, b, "backoff below the smallest subnormal")
    assert a[0] == 0


@given(scale=scaler_scales(), seed=st.integers(0, 2**32 - 1))
def test_unscale_matches_torch_kernel_bitwise_for_any_scale(scale: float, seed: int) -> None:
    """float16/32/64 gradients with inf/NaN: same unscaled bits and found_inf as torch's kernel."""
    rng = np.random.default_rng(seed)
    grads = [special_grads(rng, (int(rng.integers(0, 40)),), dt)
             for dt in (np.float32, np.float64, np.float16)]
    a, b, found_a, found_b = unscale_pair(grads, scale)
    event(f"found_inf={found_b}")
    assert found_a == found_b
    for x, y in zip(a, b, strict=True):
        assert_claim("loss_scaling.unscale", x, y, f"{x.dtype}")


SHAPES = [(3,), (2, 5)]


@settings(max_examples=15, stateful_step_count=30, deadline=None)
class ScalerStreams(RuleBasedStateMachine):
    """Both scalers, the same gradient stream, save/load between steps; equal after each."""

    @initialize(hyper=scaler_hyper(), seed=st.integers(0, 2**16))
    def start(self, hyper: dict, seed: int) -> None:
        self.pair = ScalerPair(hyper, SHAPES, seed)

    @rule(stream=scaler_grad_stream(SHAPES), explicit_unscale=st.booleans())
    def iterate(self, stream: list[np.ndarray], explicit_unscale: bool) -> None:
        self.pair.iterate(stream, explicit_unscale)
        event("skipped" if self.pair.skips[1] else "stepped")

    @rule(cross=st.booleans())
    def save_load(self, cross: bool) -> None:
        self.pair.save_load(cross)

    @invariant()
    def bit_identical(self) -> None:
        if hasattr(self, "pair"):
            for label, a, b in self.pair.compare():
                assert_claim("loss_scaling.scaler", a, b, label)


test_scaler_streams_match_torch_bitwise = ScalerStreams.TestCase


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_training_runs_learn_and_agree_within_drift_bound(precision: str) -> None:
    """60 steps: both learn (> 75% loss reduction), same scales/skips, parameters within 0.2."""
    run = train_runs(precision, steps=60)
    assert loss_reduction(run["ref"]) > 0.75 and loss_reduction(run["torch"]) > 0.75
    assert [(r.scale, r.skipped) for r in run["ref"]] == [
        (t.scale, t.skipped) for t in run["torch"]]
    if precision == "fp16":
        assert any(r.skipped for r in run["ref"]), "the fp16 run never overflowed: edge missed"
    for name, a, b in run["params"]:
        assert_claim("loss_scaling.train", a, b, name)


@pytest.mark.parametrize("scale", [1.0, 2.0**16])
def test_fp16_underflow_masks_agree_exactly(scale: float) -> None:
    """Without scaling, the same gradient elements underflow to 0 in both, layer by layer."""
    pairs = underflow_grads(scale)
    at_edge = sum(int(np.sum(np.abs(b * np.float32(scale)) == np.float32(2.0**-24)))
                  for _, _, b in pairs)
    for name, a, b in pairs:
        assert_claim("loss_scaling.underflow_mask", a == 0, b == 0, name)
    if scale == 1.0:  # guards: the fault is seeded and the edge (2^-24 next to 0) is reached
        assert any(np.any(b == 0) for _, _, b in pairs), "no underflow: the fault was not seeded"
        assert at_edge > 0, "no gradient at the smallest subnormal: the edge was not reached"


@pytest.mark.slow
def test_scaler_streams_match_torch_bitwise_long() -> None:
    """The state machine with 300 streams of up to 30 steps (run with -m slow)."""
    run_state_machine_as_test(ScalerStreams, settings=settings(
        max_examples=300, stateful_step_count=30, deadline=None))
