"""reference.optim against its own oracles: exact rational arithmetic for the FMA emulation,
hand-worked optimizer steps in dyadic numbers, schedule closed forms, torch's error messages;
and the premise about torch the reference is built on (CPU takes the for-loop path)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.format_spec import FLOAT64, FORMATS
from parity.oracles import round_exact
from reference import lr_scheduler as ref_lr
from reference import optim as ref
from reference.nn import Parameter


def _exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: type) -> np.ndarray:
    fmt = FORMATS["float32"] if dtype == np.float32 else FLOAT64  # bit widths for the oracle
    out = [round_exact(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), fmt)
           for x, y, z in zip(a.ravel(), b.ravel(), c.ravel(), strict=True)]
    return np.array(out).astype(dtype).reshape(a.shape)


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(seed=st.integers(0, 2**32 - 1), spread=st.integers(0, 60))
def test_fma_is_correctly_rounded_against_fractions(dtype: type, seed: int, spread: int) -> None:
    """fma(a, b, c) equals the exact a*b + c rounded once, over wide exponent spreads."""
    rng = np.random.default_rng(seed)
    a, b, c = (np.asarray(rng.standard_normal(64) * 2.0 ** rng.integers(-spread, spread + 1, 64))
               .astype(dtype) for _ in range(3))
    c[:8] = -(a[:8].astype(np.float64) * b[:8]).astype(dtype)  # heavy cancellation
    np.testing.assert_array_equal(_bits(ref.fma(a, b, c)), _bits(_exact_fma(a, b, c, dtype)))


def test_fma32_fixes_the_double_rounding_of_a_plain_float64_sum() -> None:
    """The NOTE's counterexample: float64 then float32 rounds twice wrongly, fma does not."""
    a = np.float32(math.ldexp(1 + 2.0**-23, -12))
    b = np.float32(math.ldexp(1 - 2.0**-23, -12))
    c = np.float32(1 + 2.0**-23)
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    exact = _exact_fma(np.array([a]), np.array([b]), np.array([c]), np.float32)[0]
    assert exact == c and naive != exact
    assert ref.fma(a, b, c) == exact


def test_unfused_fma_rounds_twice() -> None:
    """fma(..., fused=False) is NumPy's a * b + c, two roundings (torch's DEFAULT kernels)."""
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(1000).astype(np.float32) for _ in range(3))
    np.testing.assert_array_equal(_bits(ref.fma(a, b, c, fused=False)), _bits(a * b + c))
    assert np.any(ref.fma(a, b, c) != a * b + c), "fusing made no difference on 1000 draws"


def test_fma_passes_inf_and_nan_through() -> None:
    """Non-finite operands give the IEEE fma's inf/NaN, without warnings."""
    for dtype in (np.float32, np.float64):
        a = np.array([np.inf, 0.0, np.nan, 2.0], dtype=dtype)
        b = np.array([2.0, np.inf, 1.0, 3.0], dtype=dtype)
        c = np.array([1.0, 1.0, 1.0, -np.inf], dtype=dtype)
        out = ref.fma(a, b, c)
        assert out[0] == np.inf and np.isnan(out[1]) and np.isnan(out[2]) and out[3] == -np.inf


def test_lerp_is_exact_at_both_ends() -> None:
    """lerp(s, e, 0) == s and lerp(s, e, 1) == e exactly (torch's two anchored branches)."""
    rng = np.random.default_rng(1)
    s, e = rng.standard_normal(100), rng.standard_normal(100)
    np.testing.assert_array_equal(ref.lerp(s, e, np.float64(0)), s)
    np.testing.assert_array_equal(ref.lerp(s, e, np.float64(1)), e)


def test_sgd_momentum_steps_by_hand() -> None:
    """Two SGD steps with momentum and dampening in dyadic numbers, every value exact."""
    p = Parameter(np.array([1.0, -2.0]))
    opt = ref.SGD([p], lr=0.5, momentum=0.5, dampening=0.25)
    p.grad = np.array([2.0, 4.0])
    opt.step()  # b = g; p = p - 0.5 b
    np.testing.assert_array_equal(opt.state[p]["momentum_buffer"], [2.0, 4.0])
    np.testing.assert_array_equal(p.data, [0.0, -4.0])
    opt.step()  # b = 0.5 b + 0.75 g = [2.5, 5]; p = p - 0.5 b
    np.testing.assert_array_equal(opt.state[p]["momentum_buffer"], [2.5, 5.0])
    np.testing.assert_array_equal(p.data, [-1.25, -6.5])


def test_adam_first_step_by_hand() -> None:
    """One Adam step in dyadic numbers: m = 1, v = 1, corrections 1/2 and 1/4, p -= 1/2."""
    for dtype in (np.float32, np.float64):
        p = Parameter(np.array([3.0, -1.0], dtype=dtype))
        opt = ref.Adam([p], lr=0.5, betas=(0.5, 0.75), eps=0.0)
        p.grad = np.array([2.0, -2.0], dtype=dtype)
        opt.step()
        state = opt.state[p]
        assert state["step"].dtype == np.float32 and state["step"].shape == ()
        assert state["step"] == 1
        np.testing.assert_array_equal(state["exp_avg"], [1.0, -1.0])
        np.testing.assert_array_equal(state["exp_avg_sq"], [1.0, 1.0])
        # step_size = 0.5 / 0.5 = 1; denom = sqrt(1) / sqrt(0.25) = 2; p -= 1 * m / 2
        np.testing.assert_array_equal(p.data, np.array([2.5, -0.5], dtype=dtype))
        assert p.data.dtype == dtype


def test_adamw_decays_before_the_adam_update() -> None:
    """AdamW multiplies p by 1 - lr * wd first: with zero gradient p shrinks by exactly that."""
    p = Parameter(np.array([4.0]))
    opt = ref.AdamW([p], lr=0.25, weight_decay=0.5, eps=1.0)
    p.grad = np.array([0.0])
    opt.step()
    np.testing.assert_array_equal(p.data, [4.0 * (1 - 0.25 * 0.5)])


def test_state_dict_numbers_parameters_across_groups() -> None:
    """state_dict uses torch's layout: indices across groups, 'params' last, step a 0-d float32."""
    a, b, c = (Parameter(np.zeros(n)) for n in (1, 2, 3))
    opt = ref.Adam([{"params": [a]}, {"params": [b, c], "lr": 0.1}])
    for p in (a, c):
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1, 2]]
    assert list(sd["param_groups"][1])[-1] == "params" and sd["param_groups"][1]["lr"] == 0.1
    assert sorted(sd["state"]) == [0, 2]
    assert sorted(sd["state"][2]) == ["exp_avg", "exp_avg_sq", "step"]
    fresh = ref.Adam([{"params": [a]}, {"params": [b, c], "lr": 0.5}])
    fresh.load_state_dict(sd)
    assert fresh.param_groups[1]["lr"] == 0.1 and fresh.param_groups[1]["params"] == [b, c]
    np.testing.assert_array_equal(fresh.state[c]["exp_avg"], opt.state[c]["exp_avg"])


def test_zero_grad_sets_none_or_zeros_in_place() -> None:
    """zero_grad() drops gradients; zero_grad(set_to_none=False) zeros the same array."""
    p = Parameter(np.ones(3))
    opt = ref.SGD([p], lr=0.1)
    p.grad = g = np.ones(3)
    opt.zero_grad(set_to_none=False)
    assert p.grad is g and not g.any()
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize(("make", "message"), [
    (lambda ps: ref.SGD(ps, lr=-1), "Invalid learning rate: -1"),
    (lambda ps: ref.SGD(ps, momentum=-0.5), "Invalid momentum value: -0.5"),
    (lambda ps: ref.SGD(ps, nesterov=True), "Nesterov momentum requires a momentum"),
    (lambda ps: ref.Adam(ps, lr=-1), "Invalid learning rate: -1"),
    (lambda ps: ref.Adam(ps, eps=-1.0), "Invalid epsilon value: -1.0"),
    (lambda ps: ref.Adam(ps, betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
    (lambda ps: ref.AdamW(ps, betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    (lambda ps: ref.AdamW(ps, weight_decay=-1), "Invalid weight_decay value: -1"),
    (lambda ps: ref.SGD([]), "optimizer got an empty parameter list"),
    (lambda ps: ref.SGD(ps + ps), "more than once"),
])
def test_bad_hyperparameters_raise_torchs_messages(make: object, message: str) -> None:
    """Invalid settings raise ValueError with torch.optim's wording."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make([Parameter(np.zeros(2))])  # type: ignore[operator]


def test_mismatched_gradient_is_refused() -> None:
    """A gradient whose shape or dtype differs from its parameter names both."""
    p = Parameter(np.zeros(3, dtype=np.float32))
    p.grad = np.zeros(3)
    with pytest.raises(ValueError, match="float64 does not match parameter"):
        ref.SGD([p]).step()


def test_load_state_dict_checks_group_structure() -> None:
    """Loading a state with another number of groups or parameters fails like torch."""
    a, b = Parameter(np.zeros(1)), Parameter(np.zeros(1))
    sd = ref.SGD([a, b], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        ref.SGD([{"params": [a]}, {"params": [b]}]).load_state_dict(sd)
    with pytest.raises(ValueError, match="doesn't match the size"):
        ref.SGD([a]).load_state_dict(sd)


def test_steplr_equals_its_closed_form_for_dyadic_gamma() -> None:
    """With gamma = 1/2 every product is exact, so recursion and closed form agree bitwise."""
    opt = ref.SGD([Parameter(np.zeros(1))], lr=0.3)
    sched = ref_lr.StepLR(opt, step_size=3, gamma=0.5)
    for t in range(1, 40):
        sched.step()
        assert sched.get_last_lr() == [0.3 * 0.5 ** (t // 3)]


@pytest.mark.parametrize("kind", ["CosineAnnealingLR", "LinearLR"])
def test_recursive_schedules_track_their_closed_forms(kind: str) -> None:
    """The chained lrs stay within the accumulated rounding of the closed form, yet differ."""
    opt = ref.SGD([Parameter(np.zeros(1))], lr=0.1)
    kw = {"T_max": 10} if kind == "CosineAnnealingLR" else {"total_iters": 25}
    sched = getattr(ref_lr, kind)(opt, **kw)
    base, differ = 0.1, 0
    for t in range(1, 31):
        sched.step()
        if kind == "CosineAnnealingLR":
            closed = (1 + math.cos(math.pi * t / 10)) / 2 * base
        else:
            closed = base * (1 / 3 + (1 - 1 / 3) * min(25, t) / 25)
        lr = sched.get_last_lr()[0]
        differ += lr != closed
        # each chained step adds at most ~8 roundings of relative size 2**-53, and the
        # cosine's division by (1 + cos) near t = T amplifies absolute error by at most base
        assert abs(lr - closed) <= t * 8 * 2.0**-53 * base * 4
    assert differ > 0, "the chained form never differed from the closed form"


def test_linearlr_rejects_bad_factors_and_scheduler_needs_initial_lr() -> None:
    """LinearLR's factor checks and the resume guard speak torch's words."""
    opt = ref.SGD([Parameter(np.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        ref_lr.LinearLR(opt, start_factor=0)
    with pytest.raises(ValueError, match="Ending multiplicative factor"):
        ref_lr.LinearLR(opt, end_factor=1.5)
    with pytest.raises(KeyError, match="initial_lr"):
        ref_lr.StepLR(opt, step_size=2, last_epoch=4)
    with pytest.raises(TypeError, match="is not an Optimizer"):
        ref_lr.StepLR(object(), step_size=2)  # type: ignore[arg-type]


def test_torch_cpu_optimizers_take_the_for_loop_path() -> None:
    """torch picks neither foreach nor fused kernels for CPU tensors (the path mirrored)."""
    import torch
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(3), torch.zeros(2, dtype=torch.float64)]
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (
        False, False)
