"""The scaled linear layer between the trees: every GEMM operand's cast bit for bit
(fp8_train.casts), the GEMMs within the float32 order bound (fp8_train.gemm), delayed
scaling's histories and scales bit for bit (fp8_train.delayed_state); and training with it:
interrupted and resumed runs equal uninterrupted ones (fp8_train.resume_exact).
Driver: parity/drivers/fp8_train.py; torchao's Float8Linear: parity/test_fp8_train_torchao.py.
"""

from __future__ import annotations

import pytest

from common.fp8_train import SCALED_PRECISIONS
from parity.compare import assert_claim
from parity.drivers import fp8_train as drv


@pytest.fixture(scope="module", params=SCALED_PRECISIONS)
def layer_runs(request: pytest.FixtureRequest) -> tuple[str, list[list[drv.Step]]]:
    return request.param, [drv.run_layer(request.param, shape) for shape in drv.SHAPES]


def test_every_gemm_operand_is_cast_to_the_same_bits_in_both_trees(layer_runs: tuple) -> None:
    """x and W forward, g and W for grad_input, g and x for grad_weight: q(a) bit for bit."""
    precision, runs = layer_runs
    for shape, steps in zip(drv.SHAPES, runs, strict=True):
        for i, step in enumerate(steps):
            for name, (r, t) in step.casts.items():
                assert_claim("fp8_train.casts", t, r, f"{precision} {shape} step {i} {name}")


def test_scaled_gemms_agree_within_the_float32_order_bound(layer_runs: tuple) -> None:
    """Output, input, weight and bias gradients within (k + 1) eps |q(A)||q(B)|."""
    precision, runs = layer_runs
    for shape, steps in zip(drv.SHAPES, runs, strict=True):
        for i, step in enumerate(steps):
            for name, (r, t) in step.results.items():
                assert_claim("fp8_train.gemm", t, r, f"{precision} {shape} step {i} {name}",
                             scale=step.scales[name])


def test_delayed_histories_and_scales_are_the_same_bits_in_both_trees() -> None:
    """fp8-delayed: every buffer after every step, and the scales really moved off 1."""
    for shape in drv.SHAPES:
        steps = drv.run_layer("fp8-delayed", shape)
        for i, step in enumerate(steps):
            assert set(step.buffers) == {f"fp8_{kind}_{t}" for kind in ("amax_history", "scale")
                                         for t in drv.DELAYED_TENSORS}
            for name, (r, t) in step.buffers.items():
                assert_claim("fp8_train.delayed_state", t, r, f"{shape} step {i} {name}")
        assert all(steps[-1].buffers[f"fp8_scale_{t}"][0] != 1 for t in drv.DELAYED_TENSORS)
