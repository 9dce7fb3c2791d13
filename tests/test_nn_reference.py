"""reference.nn against its own oracles: central finite differences (float64) and its contract.

Finite differences: for f(x) = sum(g * forward(x)), (f(x + h e_i) - f(x - h e_i)) / 2h has
truncation error h^2 |f'''| / 6 and rounding error ~ eps |f| / h. With h = 2^-18 (3.8e-6)
and |f'''|, |f| = O(10) for the inputs below, both are < 1e-9, so FD_TOL = 1e-7 (absolute,
plus the same relative) is a safe bound that still catches any wrong term in a derivative.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from reference import losses, nn

FD_STEP = 2.0**-18
FD_TOL = 1e-7


def numeric_grad(f: Callable[[np.ndarray], float], x: np.ndarray) -> np.ndarray:
    """Central differences of a scalar function, one coordinate at a time."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + FD_STEP
        up = f(x)
        x[i] = old - FD_STEP
        down = f(x)
        x[i] = old
        grad[i] = (up - down) / (2 * FD_STEP)
    return grad


def assert_fd_close(analytic: np.ndarray, numeric: np.ndarray) -> None:
    err = np.abs(analytic - numeric)
    assert np.all(err <= FD_TOL * (1 + np.abs(numeric))), f"max error {err.max():.3g}"


def layers() -> dict[str, nn.Module]:
    rng = np.random.default_rng(0)
    return {
        "Linear": nn.Linear(5, 3, rng=rng, dtype=np.float64),
        "Linear_nobias": nn.Linear(5, 3, bias=False, rng=rng, dtype=np.float64),
        "ReLU": nn.ReLU(), "Tanh": nn.Tanh(), "GELU": nn.GELU(),
        "GELU_tanh": nn.GELU("tanh"), "Dropout": nn.Dropout(0.4, rng=rng),
        "mlp": nn.make_mlp((5, 6, 4, 3), "gelu_tanh", rng=rng, dtype=np.float64),
    }


@pytest.mark.parametrize("name", sorted(layers()))
def test_backward_matches_central_finite_differences(name: str) -> None:
    """Input and parameter gradients equal central differences of sum(g * forward(x))."""
    layer = layers()[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep ReLU's kink out of the FD stencil
    g = rng.standard_normal(layer.forward(x).shape)
    mask = layer.saved_tensors().get("mask")

    def f(_: np.ndarray) -> float:
        y = layer.forward(x, mask=mask != 0) if mask is not None else layer.forward(x)
        layer.free_saved()
        return float(np.sum(g * y))

    layer.zero_grad()
    if mask is not None:
        layer.forward(x, mask=mask != 0)
    else:
        layer.forward(x)
    dx = layer.backward(g)
    assert_fd_close(dx, numeric_grad(f, x))
    for _, p in layer.named_parameters():
        assert_fd_close(p.grad, numeric_grad(f, p.data))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_gradients_match_central_finite_differences(reduction: str) -> None:
    """MSELoss and CrossEntropyLoss (2-D and 1-D logits) backward equal central differences."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)) * 2
    cases = [(losses.MSELoss(reduction), x, rng.standard_normal((4, 3))),
             (losses.CrossEntropyLoss(reduction), x, np.array([0, 2, 1, 2])),
             (losses.CrossEntropyLoss(reduction), x[0].copy(), np.array(1))]
    for loss_fn, xi, target in cases:
        out = loss_fn(xi, target)
        g = rng.standard_normal(np.shape(out))
        dx = loss_fn.backward(g)
        assert_fd_close(dx, numeric_grad(lambda z, lf=loss_fn, t=target, gg=g:
                                         float(np.sum(gg * lf.forward(z, t))), xi))


def test_cross_entropy_value_is_negative_log_softmax() -> None:
    """CE of logits (0, log 3) with class 1 is log(1 + 3) - log 3 (mean over a batch of 1)."""
    loss = losses.CrossEntropyLoss()(np.array([[0.0, np.log(3.0)]]), np.array([1]))
    assert loss == pytest.approx(np.log(4.0) - np.log(3.0), rel=1e-15)


def test_a_loss_keeps_its_tape_until_backward_and_refuses_a_second_one() -> None:
    """A loss is a node on the same tape: forward saves, backward consumes, twice is an error."""
    loss_fn = losses.MSELoss()
    loss_fn(np.ones(3), np.zeros(3))
    assert [(s.name, s.shape) for s in loss_fn.tape()] == [("self", (3,)), ("target", (3,))]
    np.testing.assert_array_equal(loss_fn.backward(), np.full(3, 2 / 3))
    assert loss_fn.tape() == []
    with pytest.raises(RuntimeError, match=r"MSELoss\(reduction='mean'\): backward without"):
        loss_fn.backward()


def test_gradients_accumulate_until_zero_grad() -> None:
    """Two backwards sum into every .grad (torch's semantics; doubling is exact, so the sum of
    two equal gradients is exactly twice one); zero_grad sets them back to None."""
    layer = nn.Linear(3, 2, rng=np.random.default_rng(0), dtype=np.float64)
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    layer.forward(x)
    layer.backward(g)
    once = {name: p.grad.copy() for name, p in layer.named_parameters()}
    layer.forward(x)
    layer.backward(g)
    assert sorted(once) == ["bias", "weight"]
    for name, p in layer.named_parameters():
        np.testing.assert_array_equal(p.grad, 2 * once[name], err_msg=name)
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


def test_backward_frees_the_tape_and_a_second_backward_fails() -> None:
    """The tape holds exactly the named tensors until backward, then nothing."""
    model = nn.make_mlp((4, 8, 2), "relu", rng=np.random.default_rng(0), dtype=np.float32)
    model.forward(np.ones((3, 4), dtype=np.float32))
    assert [(s.module, s.name, s.shape, s.nbytes) for s in model.tape()] == [
        ("0", "input", (3, 4), 48), ("1", "result", (3, 8), 96), ("2", "input", (3, 8), 96)]
    model.backward(np.ones((3, 2), dtype=np.float32))
    assert model.tape() == []
    with pytest.raises(RuntimeError, match="backward without a forward"):
        model.backward(np.ones((3, 2), dtype=np.float32))


def test_dropout_replays_its_mask_from_a_restored_generator_state() -> None:
    """Restoring rng.bit_generator.state replays the same mask (what recompute relies on)."""
    drop = nn.Dropout(0.5, rng=np.random.default_rng(7))
    x = np.ones((16, 16), dtype=np.float32)
    state = drop.rng.bit_generator.state
    first = drop.forward(x)
    drop.rng.bit_generator.state = state
    np.testing.assert_array_equal(drop.forward(x), first)
    assert set(np.unique(first)) == {0.0, 2.0}
    assert nn.make_mlp((2, 3, 2), dropout=0.1, rng=drop.rng).generators() == {
        "2": drop.rng}


def test_dropout_eval_and_p0_are_identity_and_save_nothing() -> None:
    """eval() and p = 0 return the input itself and keep no tape (as torch)."""
    x = np.arange(6.0).reshape(2, 3)
    for drop in (nn.Dropout(0.5, rng=np.random.default_rng(0)).eval(),
                 nn.Dropout(0.0, rng=np.random.default_rng(0))):
        assert drop.forward(x) is x and drop.tape() == []
        assert drop.backward(x) is x


def test_linear_init_is_uniform_within_one_over_sqrt_fan_in() -> None:
    """Weights and biases lie in [-1/sqrt(in), 1/sqrt(in)] and fill it (torch's default)."""
    layer = nn.Linear(100, 400, rng=np.random.default_rng(0), dtype=np.float64)
    bound = 1 / np.sqrt(100)
    for p in (layer.weight.data, layer.bias.data):
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.99 * bound
    assert layer.weight.data.shape == (400, 100)


@pytest.mark.parametrize(("make", "x", "message"), [
    (lambda: nn.Linear(4, 3, rng=np.random.default_rng(0)), np.ones((2, 5), np.float32),
     r"Linear\(4, 3\): expected input \(\.\.\., 4\), got \(2, 5\)"),
    (lambda: nn.Linear(4, 3, rng=np.random.default_rng(0)), np.ones((2, 4), np.float64),
     r"Linear\(4, 3\): input is float64 but the weights are float32"),
    (lambda: nn.ReLU(), np.ones(3, np.int64), r"ReLU\(\): expected a float32 or float64"),
])
def test_bad_inputs_raise_errors_naming_module_and_shapes(make: Callable[[], nn.Module],
                                                          x: np.ndarray, message: str) -> None:
    """Wrong shapes or dtypes are refused at the boundary with the module and shapes named."""
    with pytest.raises((ValueError, TypeError), match=message):
        make().forward(x)


def test_bad_arguments_are_refused() -> None:
    """Bad constructor arguments, gradients and targets get clear errors."""
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="approximate must be"):
        nn.GELU("fast")
    with pytest.raises(ValueError, match="p must be in"):
        nn.Dropout(1.5, rng=rng)
    with pytest.raises(ValueError, match="reduction must be"):
        losses.MSELoss("avg")
    with pytest.raises(ValueError, match="activation must be"):
        nn.make_mlp((2, 2, 2), "swish", rng=rng)
    relu = nn.ReLU()
    relu.forward(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"ReLU\(\): expected grad_output of shape \(2, 3\)"):
        relu.backward(np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"target classes must lie in \[0, 3\)"):
        losses.CrossEntropyLoss()(np.ones((2, 3)), np.array([0, 3]))
    model = nn.make_mlp((2, 3, 2), rng=rng)
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({})


def test_matmul_warns_of_an_invalid_operation_by_the_products_values_not_the_fpu_flags(
) -> None:
    """NOTE [ Spurious BLAS flags ]: a NaN the operands explain is no new invalid operation
    (no warning); inf - inf inside the sums is one (warned); finite products never warn."""
    import warnings

    from reference.nn import matmul

    big = np.float32(3e38)
    a = np.array([[big, big]], np.float32)
    b = np.array([[1.0], [-1.0]], np.float32)  # big - big = 0: finite
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert matmul(a, b)[0, 0] == 0
        nan_in = np.array([[np.nan, 1.0]], np.float32)
        assert np.isnan(matmul(nan_in, b)[0, 0])  # explained by the operand: silent
    inf_minus_inf = np.array([[np.inf, np.inf]], np.float32)
    with pytest.warns(RuntimeWarning, match="invalid value encountered in matmul"):
        assert np.isnan(matmul(inf_minus_inf, b)[0, 0])
    with np.errstate(invalid="ignore"), warnings.catch_warnings():  # the caller's choice
        warnings.simplefilter("error")
        assert np.isnan(matmul(inf_minus_inf, b)[0, 0])
    with np.errstate(invalid="raise"), pytest.raises(FloatingPointError, match="matmul"):
        matmul(inf_minus_inf, b)
