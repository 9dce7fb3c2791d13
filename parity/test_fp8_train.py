"""The scaled linear layer between the trees: every GEMM operand's cast bit for bit
(fp8_train.casts), the GEMMs within the float32 order bound (fp8_train.gemm), delayed
scaling's histories and scales bit for bit (fp8_train.delayed_state); and training with it:
interrupted and resumed runs equal uninterrupted ones (fp8_train.resume_exact), the random
bits of nvfp4 and bf16-sr included. The 2025-26 recipes written apart:
parity/test_fp8_train_recipes.py.
Driver: parity/drivers/fp8_train.py; torchao's Float8Linear: parity/test_fp8_train_torchao.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.fp8_train import GPT_PRECISIONS, SCALED_PRECISIONS, Recipe, needs_bits, recipe
from common.gpt_config import TRAIN_SHAPE
from common.recipes_train import BitStream
from parity.compare import as_numpy, assert_claim, assert_observed
from parity.drivers import fp8_train as drv
from parity.drivers import gpt_learn as gl
from parity.drivers.fp8_train_learn import LEARN_PRECISIONS, learn
from parity.drivers.train import compare_runs, interrupted, one_thread, uninterrupted
from reference import fp8_train as rfp8
from reference.nn import Linear
from torch_impl import fp8_train as tfp8


def _casts(quantize: Any, x2: Any, w: Any, g2: Any, r: Recipe) -> dict[str, Any]:
    """q of each GEMM operand by one tree's quantize, K on the axis that GEMM sums over."""
    return {"output.x": quantize(x2, r.forward, r, 1), "output.W": quantize(w, r.forward, r, 1),
            "grad_input.g": quantize(g2, r.backward, r, 1),
            "grad_input.W": quantize(w, r.forward, r, 0),
            "grad_weight.g": quantize(g2, r.backward, r, 0),
            "grad_weight.x": quantize(x2, r.forward, r, 0)}


def test_one_fp8_linear_forward_and_backward_match_in_both_trees(device: str) -> None:
    """One Linear with the same weights in each tree, converted to a ScaledLinear of
    fp8-tensorwise: one forward and backward casts every GEMM operand to the same bits
    (fp8_train.casts), and the output and the three gradients agree within the float32 order
    bound of those cast operands (fp8_train.gemm)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)  # (N, in)
    g = (rng.standard_normal((8, 4)) * 1e-3).astype(np.float32)  # (N, out): dL/dy
    ref_linear = Linear(16, 4, rng=rng)
    torch_linear = torch.nn.Linear(16, 4, device=device)
    torch_linear.load_state_dict({k: torch.from_numpy(v).to(device)
                                  for k, v in ref_linear.state_dict().items()})
    ref_layer = rfp8.ScaledLinear(ref_linear, "fp8-tensorwise")  # x, W in e4m3; g in e5m2
    torch_layer = tfp8.ScaledLinear(torch_linear, "fp8-tensorwise")
    ref_y = ref_layer.forward(x)  # (N, out)
    ref_dx = ref_layer.backward(g)  # (N, in)
    tx, tg = torch.from_numpy(x).to(device).requires_grad_(), torch.from_numpy(g).to(device)
    torch_y = torch_layer(tx)
    torch_y.backward(tg)
    r = recipe("fp8-tensorwise")
    ref_q = _casts(rfp8.quantize, x, ref_layer.weight.data, g, r)
    with torch.no_grad():
        torch_q = _casts(tfp8.quantize, tx, torch_layer.weight, tg, r)
    assert not np.array_equal(ref_q["output.x"], x)  # the casts rounded
    for name, q in ref_q.items():
        assert_claim("fp8_train.casts", actual=torch_q[name], expected=q, context=name)
    s = drv.gemm_scales(ref_q, ref_layer.bias.data, g)  # (k + 1)(|q(A)| |q(B)| + |b|)
    for name, ref_value, torch_value in (
            ("y", ref_y, torch_y), ("dx", ref_dx, tx.grad),
            ("weight", ref_layer.weight.grad, torch_layer.weight.grad),
            ("bias", ref_layer.bias.grad, torch_layer.bias.grad)):
        assert_claim("fp8_train.gemm", actual=torch_value, expected=ref_value, context=name,
                     scale=s[name])


@pytest.fixture(scope="module", params=SCALED_PRECISIONS)
def layer_runs(request: pytest.FixtureRequest) -> tuple[str, list[list[drv.Step]]]:
    return request.param, [drv.run_layer(request.param, shape) for shape in drv.SHAPES]


def test_every_gemm_operand_is_cast_to_the_same_bits_in_both_trees(layer_runs: tuple) -> None:
    """x and W forward, g and W for grad_input, g and x for grad_weight: q(a) bit for bit."""
    precision, runs = layer_runs
    for shape, steps in zip(drv.SHAPES, runs, strict=True):
        for i, step in enumerate(steps):
            for name, (r, t) in step.casts.items():
                assert_claim("fp8_train.casts", actual=t, expected=r,
                             context=f"{precision} {shape} step {i} {name}")


def test_scaled_gemms_agree_within_the_float32_order_bound(layer_runs: tuple) -> None:
    """Output, input, weight and bias gradients within (k + 1) eps |q(A)||q(B)|."""
    precision, runs = layer_runs
    for shape, steps in zip(drv.SHAPES, runs, strict=True):
        for i, step in enumerate(steps):
            for name, (r, t) in step.results.items():
                assert_claim("fp8_train.gemm", actual=t, expected=r,
                             context=f"{precision} {shape} step {i} {name}",
                             scale=step.scales[name])


def test_delayed_histories_and_scales_are_the_same_bits_in_both_trees() -> None:
    """fp8-delayed: every buffer after every step, and the scales really moved off 1."""
    for shape in drv.SHAPES:
        steps = drv.run_layer("fp8-delayed", shape)
        for i, step in enumerate(steps):
            assert set(step.buffers) == {f"fp8_{kind}_{t}" for kind in ("amax_history", "scale")
                                         for t in drv.DELAYED_TENSORS}
            for name, (r, t) in step.buffers.items():
                assert_claim("fp8_train.delayed_state", actual=t, expected=r,
                             context=f"{shape} step {i} {name}")
        assert all(steps[-1].buffers[f"fp8_scale_{t}"][0] != 1 for t in drv.DELAYED_TENSORS)


# A small transformer run: 3 batches of 4 an epoch, dropout on, Adam (buffers to restore)
RUN = {"model": "gpt", "seed": 3, "dropout": 0.2, "optimizer": "Adam", "schedule": "cosine",
       "horizon": 4, "batch_size": 4, "num_samples": 12}
# the ones with state of their own: the amax histories, the random bits of nvfp4 and bf16-sr
DEFAULT_RESUME = ("fp8-delayed", "nvfp4", "bf16-sr")


def _resume_case(name: str, precision: str) -> None:
    config = {**RUN, "precision": precision, "optimizer": "AdamW" if precision == "bf16-sr"
              else RUN["optimizer"]}
    with one_thread():
        expected = uninterrupted(name, config, 4)
        with tempfile.TemporaryDirectory() as tmp:
            actual = interrupted(name, config, 2, 4, Path(tmp))
    if precision == "fp8-delayed":  # the histories are in the checkpoint, and moved
        keys = [k for k in expected["model"] if "fp8_amax_history" in k]
        assert len(keys) == 3 * 4 * TRAIN_SHAPE.n_layer
        assert all(np.any(as_numpy(expected["model"][k]) != 0) for k in keys)
    if needs_bits(precision):  # the bit stream is in the checkpoint, and moved
        assert actual["rng"]["bits"] != BitStream(RUN["seed"]).state()
    worst, n = compare_runs(actual, expected)
    assert_observed("fp8_train.resume_exact", worst, n, f"{name} {precision}")


@pytest.mark.parametrize("name", ["reference", "torch"])
@pytest.mark.parametrize("precision", DEFAULT_RESUME)
def test_scaled_gpt_run_interrupted_and_resumed_equals_uninterrupted(name: str,
                                                                     precision: str) -> None:
    """Interrupted at step 2 of 4, resumed from the file: the uninterrupted run's bits,
    the amax histories and scales included."""
    _resume_case(name, precision)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "torch"])
@pytest.mark.parametrize("precision", [p for p in GPT_PRECISIONS if p not in DEFAULT_RESUME])
def test_every_scaled_precision_resumes_exactly(name: str, precision: str) -> None:
    """The other precisions, the same claim."""
    _resume_case(name, precision)


@pytest.mark.slow
@pytest.mark.parametrize("precision", LEARN_PRECISIONS)
def test_the_tiny_gpt_learns_the_copy_task_in_every_scaled_precision(precision: str) -> None:
    """The learning control (torch tree): bf16 and every scaled precision end the control's
    400 steps above the target held-out copy accuracy (docs/data/fp8_learning.json)."""
    with one_thread():
        curve = learn("torch", precision, gl.CONTROL_STEPS)
    assert curve.accuracy[-1] >= gl.TARGET_ACCURACY, (precision, curve.accuracy)
