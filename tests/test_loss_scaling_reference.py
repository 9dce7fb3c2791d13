"""reference.loss_scaling, loss_scale_kernels and clip_grad against their own oracles: the
kernels' docstring pseudocode, torch's documented errors and semantics, the extras
(min_scale, hysteresis, last_step_skipped), clipping against a float64 oracle, and the
seeded faults (float16 without scaling, clipping before unscale_, bfloat16 range)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pseudocode import pseudocode

from parity.strategies import examples
from reference import clip_grad
from reference import loss_scale_kernels as kernels
from reference import loss_scaling as rls
from reference import nn as rnn
from reference import optim as ropt
from reference import train as rtrain
from reference.nn import Parameter

UPDATE_RULE = pseudocode(kernels.__doc__, "update_rule")


def _one_param_scaler(**kwargs: object) -> tuple[rls.GradScaler, ropt.SGD, Parameter]:
    p = Parameter(np.zeros(3, np.float32))
    return rls.GradScaler(**kwargs), ropt.SGD([p], lr=0.1), p  # type: ignore[arg-type]


def _iterate(scaler: rls.GradScaler, opt: ropt.SGD, p: Parameter, found_inf: bool) -> None:
    scaler.scale(np.float32(1.0))
    p.grad = np.array([1.0, np.inf if found_inf else 2.0, 3.0], np.float32)
    scaler.step(opt)
    scaler.update()


@settings(examples(60))
@given(init=st.floats(2.0**-149, 3e38), growth=st.floats(1.0, 10.0, exclude_min=True),
       backoff=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
       interval=st.integers(1, 4), hysteresis=st.integers(1, 3),
       min_scale=st.one_of(st.none(), st.floats(2.0**-20, 4.0)),
       found=st.lists(st.booleans(), min_size=1, max_size=25))
def test_update_matches_docstring_pseudocode(init: float, growth: float, backoff: float,
                                             interval: int, hysteresis: int,
                                             min_scale: float | None,
                                             found: list[bool]) -> None:
    """Every update of GradScaler equals the docstring's scalar update_rule, bit for bit."""
    scaler, opt, p = _one_param_scaler(init_scale=init, growth_factor=growth,
                                       backoff_factor=backoff, growth_interval=interval,
                                       hysteresis=hysteresis, min_scale=min_scale)
    scale, tracker, hyst = float(np.float32(init)), 0, hysteresis
    for f in found:
        _iterate(scaler, opt, p, f)
        scale, tracker, hyst = UPDATE_RULE(scale, tracker, hyst, f, growth, backoff, interval,
                                           hysteresis, min_scale)
        assert np.float32(scaler.get_scale()).tobytes() == np.float32(scale).tobytes()
        assert scaler._get_growth_tracker() == tracker
        assert scaler.last_step_skipped is f
    event("grew" if scale > np.float32(init) else "did not grow")


@settings(examples(300))
@given(scale=st.one_of(st.floats(0.0, float(np.finfo(np.float32).max), width=32),
                      st.sampled_from([0.0, 2.0**-149])),
       tracker=st.integers(0, 8), hyst=st.integers(0, 3), found=st.booleans(),
       growth=st.floats(1.0, 10.0, exclude_min=True),
       backoff=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
       interval=st.integers(-1, 6), hysteresis=st.integers(1, 3),
       min_scale=st.one_of(st.none(), st.floats(2.0**-20, 4.0)))
def test_update_kernel_is_the_docstring_pseudocode_from_any_state(
        scale: float, tracker: int, hyst: int, found: bool, growth: float, backoff: float,
        interval: int, hysteresis: int, min_scale: float | None) -> None:
    """update_scale_ from any state (trackers past the interval, growth_interval <= 0, zero
    and subnormal scales) equals the pseudocode bit for bit, hysteresis tracker included."""
    s, t = np.array(scale, np.float32), np.array(tracker, np.int32)
    new_hyst = kernels.update_scale_(s, t, np.array(float(found), np.float32), growth, backoff,
                                     interval, hysteresis_tracker=hyst, hysteresis=hysteresis,
                                     min_scale=min_scale)
    want = UPDATE_RULE(float(np.float32(scale)), tracker, hyst, found, growth, backoff,
                       interval, hysteresis, min_scale)
    assert (s.tobytes(), int(t), new_hyst) == (np.float32(want[0]).tobytes(), want[1], want[2])
    event("grew" if s > np.float32(scale) else "backed off" if s < np.float32(scale) else "kept")


def test_growth_happens_on_exactly_the_interval_th_finite_step() -> None:
    """growth_interval 3: the scale doubles after the 3rd, 6th, ... finite step, never earlier."""
    scaler, opt, p = _one_param_scaler(init_scale=8.0, growth_interval=3)
    seen = []
    for _ in range(7):
        _iterate(scaler, opt, p, False)
        seen.append(scaler.get_scale())
    assert seen == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_non_power_of_two_factors_round_through_float64() -> None:
    """The backed-off scale is f32(f64(S) * b), which can differ from the float32 product."""
    rng = np.random.default_rng(0)
    differ = 0
    for _ in range(2000):
        s, b = np.float32(rng.uniform(1, 2**20)), float(rng.uniform(0.1, 0.9))
        scaler, opt, p = _one_param_scaler(init_scale=float(s), backoff_factor=b)
        _iterate(scaler, opt, p, True)
        assert np.float32(scaler.get_scale()) == np.float32(np.float64(s) * b)
        differ += np.float32(scaler.get_scale()) != s * np.float32(b)
    assert differ > 0, "float32 and float64 products never differed: the edge was not reached"


def test_unscale_multiplies_by_reciprocal_not_divides() -> None:
    """g * f32(1/f64(S)) equals g / S for S = 2^k, and differs from it for other S."""
    rng = np.random.default_rng(1)
    g = rng.standard_normal(10_000).astype(np.float32)
    for scale, expect_equal in ((2.0**13, True), (3.0, False), (1000.0, False)):
        scaler, opt, p = _one_param_scaler(init_scale=scale)
        scaler.scale(np.float32(1.0))
        p.data = np.zeros_like(g)
        p.grad = g.copy()
        scaler.unscale_(opt)
        divided = g / np.float32(scale)
        assert np.array_equal(p.grad, divided) is expect_equal, scale


def test_reciprocal_through_float64_is_the_correctly_rounded_float32_reciprocal() -> None:
    """inv_scale(S) = f32(1 / f64(S)) equals the float32 division 1 / S for every float32
    significand (all of [1, 2)) and for every power of two from 2^-149 to 2^127: the double
    rounding of NOTE [ Unscale by reciprocal ] never shows (53 >= 2 * 24 + 2 bits)."""
    ones = np.arange(0x3F800000, 0x40000000, dtype=np.uint32).view(np.float32)
    powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    for s in (ones, powers, ones * np.float32(2.0**-100), ones * np.float32(2.0**100)):
        with np.errstate(divide="ignore", over="ignore"):
            assert np.array_equal(kernels.inv_scale(s), np.float32(1) / s)


def test_misuse_raises_torchs_errors() -> None:
    """unscale_ twice, unscale_ after step, step twice, update without step, fp16 grads,
    closures and bad factors raise torch's exception types and messages."""
    scaler, opt, p = _one_param_scaler()
    with pytest.raises(AssertionError, match="_scale is None"):
        scaler.unscale_(opt)
    scaler.scale(np.float32(1.0))
    p.grad = np.ones(3, np.float32)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="being called after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        scaler.update()
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: 0.0)
    p.grad = np.ones(3, np.float16)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)
    with pytest.raises(AssertionError, match="growth factor"):
        rls.GradScaler(growth_factor=1.0)
    with pytest.raises(AssertionError, match="backoff factor"):
        rls.GradScaler(backoff_factor=1.0)
    with pytest.raises(RuntimeError, match="state dict is empty"):
        rls.GradScaler().load_state_dict({})


def test_disabled_scaler_is_a_pass_through() -> None:
    """enabled=False: scale returns its input, step just steps, state_dict is {}."""
    scaler, opt, p = _one_param_scaler(enabled=False)
    loss = np.float32(3.0)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    p.grad = np.array([np.inf, 0, 0], np.float32)
    scaler.step(opt)
    scaler.update()
    assert np.isinf(p.data[0]) and scaler.state_dict() == {}


def test_state_dict_has_torchs_keys_by_default_and_extras_only_when_used() -> None:
    """Defaults give torch's five keys; min_scale/hysteresis add theirs and round-trip."""
    assert set(rls.GradScaler().state_dict()) == {
        "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    a, opt, p = _one_param_scaler(hysteresis=3, min_scale=1.0)
    _iterate(a, opt, p, True)
    b = rls.GradScaler()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()


def test_scale_collapses_to_zero_without_min_scale_and_never_recovers() -> None:
    """torch's behaviour: 300 overflows drive S to 0.0; with min_scale it stops there."""
    for min_scale, floor in ((None, 0.0), (1.0, 1.0)):
        scaler, opt, p = _one_param_scaler(growth_interval=1, min_scale=min_scale)
        for _ in range(300):
            _iterate(scaler, opt, p, True)
        assert scaler.get_scale() == floor
        for _ in range(5):
            _iterate(scaler, opt, p, False)
        assert (scaler.get_scale() == 0.0) is (min_scale is None)


def test_hysteresis_tolerates_k_minus_one_overflows_in_a_row() -> None:
    """hysteresis=3: two overflows keep S, the third backs off; a finite step refills."""
    scaler, opt, p = _one_param_scaler(hysteresis=3, init_scale=1024.0)
    seen = []
    for f in (True, True, False, True, True, True, True):
        _iterate(scaler, opt, p, f)
        seen.append(scaler.get_scale())
    assert seen == [1024.0, 1024.0, 1024.0, 1024.0, 1024.0, 512.0, 256.0]


def test_static_loss_scaler_keeps_its_scale_and_still_skips() -> None:
    """StaticLossScaler: S never changes; an inf gradient still skips the step."""
    p = Parameter(np.zeros(3, np.float32))
    scaler, opt = rls.StaticLossScaler(128.0), ropt.SGD([p], lr=0.1)
    for f in (True, False, True):
        _iterate(scaler, opt, p, f)
        assert scaler.get_scale() == 128.0 and scaler.last_step_skipped is f


# -- clipping
@settings(examples(50))
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(1, 400), min_size=1,
                                                       max_size=4), k=st.integers(-20, 20))
def test_total_norm_within_the_n_term_bound_of_the_exact_norm(seed: int, sizes: list[int],
                                                               k: int) -> None:
    """get_total_norm is within (n + m + 6)/2 u of the exact 2-norm (float64 oracle)."""
    rng = np.random.default_rng(seed)
    grads = [(rng.standard_normal(n) * 2.0**k).astype(np.float32) for n in sizes]
    exact = math.sqrt(math.fsum(float(v) ** 2 for g in grads for v in g.astype(np.float64)))
    got = float(clip_grad.get_total_norm(grads))
    assert abs(got - exact) <= (max(sizes) + len(sizes) + 6) / 2 * 2.0**-24 * exact


def test_clip_leaves_gradients_below_max_norm_and_scales_them_above() -> None:
    """Below max_norm - 1e-6 the gradients keep their bits; above, the global norm becomes
    max_norm (within float32 rounding); the returned norm is the one before clipping."""
    g = np.array([3.0, 4.0], np.float32)  # norm 5
    for max_norm, want_norm in ((10.0, 5.0), (1.0, 1.0)):
        p = Parameter(np.zeros(2, np.float32))
        p.grad = g.copy()
        assert float(clip_grad.clip_grad_norm_([p], max_norm)) == 5.0
        assert abs(float(np.linalg.norm(p.grad)) - want_norm) <= 4 * 2.0**-24 * want_norm
        assert (p.grad.tobytes() == g.tobytes()) is (max_norm == 10.0)


def test_non_finite_norms_zero_or_poison_the_gradients() -> None:
    """An inf norm gives coefficient 0 (finite gradients 0, infinite NaN); a NaN norm NaN."""
    for norm, finite_becomes in ((np.inf, 0.0), (np.nan, np.nan)):
        p = Parameter(np.zeros(3, np.float32))
        p.grad = np.array([1.0, -2.0, np.inf], np.float32)
        clip_grad.clip_grads_with_norm_([p], 1.0, np.array(norm, np.float32))
        assert np.array_equal(p.grad[:2], [finite_becomes] * 2, equal_nan=True)
        assert np.isnan(p.grad[2])


def test_clip_refuses_other_norms_and_mixed_dtypes() -> None:
    """Only the 2-norm is implemented; gradients of several dtypes are refused."""
    with pytest.raises(ValueError, match=r"only norm_type=2\.0"):
        clip_grad.get_total_norm([np.ones(2, np.float32)], norm_type=1.0)
    with pytest.raises(TypeError, match="one dtype"):
        clip_grad.get_total_norm([np.ones(2, np.float32), np.ones(2, np.float64)])
    assert float(clip_grad.get_total_norm([])) == 0.0
    assert rls.clip_grad_norm_ is clip_grad.clip_grad_norm_  # re-exported for train.py


# -- the canonical step and the seeded faults
def _model() -> tuple[rnn.Sequential, ropt.SGD]:
    model = rnn.make_mlp((16, 64, 64, 4), "gelu", rng=np.random.default_rng(1))
    model[4].weight.data *= np.float32(2.0**-10)  # small-init output layer: tiny gradients
    return model, ropt.SGD(model.parameters(), lr=0.1)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (rng.standard_normal((256, 16)).astype(np.float32),
            (rng.standard_normal((256, 4)) * 0.1).astype(np.float32))


def _zero_fraction(model: rnn.Sequential) -> float:
    return float(np.mean(np.concatenate([p.grad.ravel() == 0 for p in model.parameters()])))


def test_fp16_without_a_scaler_is_refused() -> None:
    """train_step refuses precision fp16 with a disabled scaler (the guard of fault 1)."""
    model, opt = _model()
    with pytest.raises(ValueError, match="needs an enabled GradScaler"):
        rtrain.train_step(model, rnn.MSELoss(), opt, rls.make_scaler("fp32"), *_batch(),
                       precision="fp16")


def test_fault_fp16_without_scaler_underflows_and_scaling_repairs_it() -> None:
    """Detector 'no gradient element is exactly 0' fires without scaling, not with it."""
    model, opt = _model()
    rtrain.train_step(model, rnn.MSELoss(), opt, rls.make_scaler("fp32"), *_batch(),
                   precision="fp16", fault="fp16_without_scaler")
    faulty = _zero_fraction(model)
    model, opt = _model()
    rtrain.train_step(model, rnn.MSELoss(), opt, rls.make_scaler("fp16"), *_batch(),
                   precision="fp16")
    assert faulty > 0.05 and _zero_fraction(model) == 0.0


def test_fault_bf16_needs_no_scaling() -> None:
    """The same model and batch under bf16 without a scaler: no element underflows."""
    model, opt = _model()
    rtrain.train_step(model, rnn.MSELoss(), opt, rls.make_scaler("bf16"), *_batch(),
                   precision="bf16")
    assert _zero_fraction(model) == 0.0


def test_fault_clip_before_unscale_clips_at_max_norm_times_scale() -> None:
    """Clipping scaled gradients sees a norm S times too large, so the applied update is
    S times smaller than with clipping after unscale_ (the detector: grad_norm ~ S ||g||)."""
    results, moves = {}, {}
    for fault in (None, "clip_before_unscale"):
        model, opt = _model()
        before = [p.data.copy() for p in model.parameters()]
        scaler = rls.make_scaler("fp16", init_scale=2.0**10)
        results[fault] = rtrain.train_step(model, rnn.MSELoss(), opt, scaler, *_batch(),
                                        precision="fp16", max_grad_norm=1e-3, fault=fault)
        moves[fault] = math.sqrt(sum(float(np.sum((p.data - b) ** 2))
                                     for p, b in zip(model.parameters(), before, strict=True)))
    good, bad = results[None], results["clip_before_unscale"]
    assert good.grad_norm is not None and bad.grad_norm is not None
    assert bad.grad_norm / good.grad_norm == pytest.approx(2.0**10, rel=1e-2)
    assert good.grad_norm > 1e-3  # the repaired step clips to max_norm: it moves lr * 1e-3
    assert moves[None] == pytest.approx(0.1 * 1e-3, rel=1e-2)
    assert moves["clip_before_unscale"] == pytest.approx(0.1 * 1e-3 / 2.0**10, rel=1e-2)
