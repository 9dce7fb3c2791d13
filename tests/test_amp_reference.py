"""reference.amp against its own oracles: fp32 is the plain model bit for bit, every lp
result is a member of the format, master weights are untouched, an autocast Linear is the
exact product of its lp operands rounded once (float64 oracle), and the autocast backward
rounds the incoming float32 gradient to lp first (as torch's cast backward does)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import amp
from reference import nn as rnn
from reference.formats import quantize, ulp_distance


def _model(activation: str = "tanh") -> rnn.Sequential:
    return rnn.make_mlp((6, 16, 3), activation, rng=np.random.default_rng(0))


def test_fp32_autocast_is_the_plain_model_bit_for_bit() -> None:
    """Autocast(model, None) runs model.forward/backward unchanged."""
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    a, b = _model(), _model()
    ya, yb = amp.Autocast(a, None)(x), b(x)
    assert np.array_equal(ya, yb)
    g = np.ones_like(ya)
    assert np.array_equal(amp.Autocast(a, None).backward(g), b.backward(g))


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_outputs_and_grads_are_lp_members_and_master_weights_stay(fmt: str) -> None:
    """Output, every layer's output and received gradient, and the parameter gradients are
    values of fmt; weights are not rounded in place."""
    model = _model()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    ac = amp.Autocast(model, fmt)
    y = ac(np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32))
    ac.backward(np.random.default_rng(3).standard_normal(y.shape).astype(np.float32))
    assert np.array_equal(y, quantize(y, fmt))
    for v in [*ac.outputs, *ac.output_grads]:
        assert np.array_equal(v, quantize(v, fmt))
    for name, p in model.named_parameters():
        assert np.array_equal(p.data, before[name]), name
        assert p.grad is not None and np.array_equal(p.grad, quantize(p.grad, fmt)), name
    assert model.tape() == []  # backward consumed every saved tensor


@settings(max_examples=30)
@given(fmt=st.sampled_from(["bfloat16", "float16"]),
       activation=st.sampled_from(["gelu", "tanh", "relu"]), seed=st.integers(0, 2**32 - 1))
def test_backward_rounds_the_incoming_gradient_first(fmt: str, activation: str,
                                                     seed: int) -> None:
    """backward(g) and backward(q(g)) give the same bits: the float32 loss gradient is rounded
    to lp once, before the last Linear sees it (torch's ToCopyBackward0)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    g = rng.standard_normal((4, 3)).astype(np.float32)  # 24 significant bits: not lp
    assert not np.array_equal(g, quantize(g, fmt)), "the gradient must need the rounding"
    results = []
    for grad in (g, quantize(g, fmt)):
        model = _model(activation)
        runner = amp.Autocast(model, fmt)
        runner(x)
        dx = runner.backward(grad)
        results.append([dx, runner.output_grads[-1], *(p.grad for p in model.parameters())])
    for a, b in zip(*results, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_linear_is_the_lp_operands_product_rounded_once(fmt: str) -> None:
    """y = q(q(x) q(W)^T + q(b)) within 1 lp ulp of the float64 product rounded once."""
    rng = np.random.default_rng(3)
    layer = rnn.Linear(32, 8, rng=rng)
    x = rng.standard_normal((10, 32)).astype(np.float32)
    y = amp.linear_forward(layer, x, fmt)
    exact = (quantize(x, fmt).astype(np.float64) @ quantize(layer.weight.data, fmt).T
             + quantize(layer.bias.data, fmt))  # type: ignore[union-attr]
    assert ulp_distance(y, quantize(exact, fmt), fmt).max() <= 1


def test_op_policies_follow_the_lists() -> None:
    """linear is lower_precision_fp on both devices, mv only on CUDA, cross_entropy_loss fp32
    only on CPU; activations are on no list; an unknown device type is refused."""
    assert [amp.op_policy("linear", d) for d in ("cpu", "cuda")] == ["lower_precision_fp"] * 2
    assert [amp.op_policy("mv", d) for d in ("cpu", "cuda")] == [None, "lower_precision_fp"]
    assert [amp.op_policy("cross_entropy_loss", d) for d in ("cpu", "cuda")] == ["fp32", None]
    assert {amp.op_policy(op) for op in ("gelu", "tanh", "relu", "dropout")} == {None}
    assert amp.op_policy("ctc_loss") == "fp32"  # listed by its overloads
    with pytest.raises(ValueError, match="device_type must be one of"):
        amp.op_policy("linear", "xpu")


def test_bad_dtype_layers_and_backward_without_forward_are_refused() -> None:
    """Unknown dtypes and device types are a ValueError, a layer with no emulation a
    NotImplementedError, backward before forward a RuntimeError."""
    with pytest.raises(ValueError, match="dtype must be"):
        amp.Autocast(_model(), "float8_e4m3fn")
    with pytest.raises(ValueError, match="device_type must be one of"):
        amp.Autocast(_model(), "float16", "mps")
    with pytest.raises(NotImplementedError, match="no emulation"):
        amp.Autocast(rnn.Sequential(rnn.MSELoss()), "float16")
    with pytest.raises(RuntimeError, match="without an autocast forward"):
        amp.Autocast(_model(), "float16").backward(np.ones((5, 3), np.float32))
