"""reference.amp against its own oracles: fp32 is the plain model bit for bit, every lp
result is a member of the format, master weights are untouched, and an autocast Linear is
the exact product of its lp operands rounded once (float64 oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from reference import amp
from reference import nn as rnn
from reference.formats import quantize, ulp_distance


def _model() -> rnn.Sequential:
    return rnn.make_mlp((6, 16, 3), "tanh", rng=np.random.default_rng(0))


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
    """Output and parameter gradients are values of fmt; weights are not rounded in place."""
    model = _model()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    ac = amp.Autocast(model, fmt)
    y = ac(np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32))
    ac.backward(np.ones_like(y))
    assert np.array_equal(y, quantize(y, fmt))
    for name, p in model.named_parameters():
        assert np.array_equal(p.data, before[name]), name
        assert p.grad is not None and np.array_equal(p.grad, quantize(p.grad, fmt)), name
    assert model.tape() == []  # backward consumed every saved tensor


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


def test_bad_dtype_and_backward_without_forward_are_refused() -> None:
    """Unknown dtypes are a ValueError; backward before forward a RuntimeError."""
    with pytest.raises(ValueError, match="dtype must be"):
        amp.Autocast(_model(), "float8_e4m3fn")
    with pytest.raises(RuntimeError, match="without an autocast forward"):
        amp.Autocast(_model(), "float16").backward(np.ones((5, 3), np.float32))
