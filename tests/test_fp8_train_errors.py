"""Bad input to the scaled linear layer and the scaled precisions: a clear error naming the
problem, in both trees (reference/fp8_train.py, torch_impl/fp8_train.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.fp8_train import recipe
from common.train_config import TrainConfig
from reference import fp8_train as rfp8
from reference.nn import Linear
from torch_impl import fp8_train as tfp8


def test_an_unknown_precision_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="fp8-tensorwise"):
        recipe("fp8")


def test_mx_needs_in_features_divisible_by_the_block_in_both_trees() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        rfp8.ScaledLinear(Linear(16, 32, rng=np.random.default_rng(0)), "mxfp8")
    with pytest.raises(ValueError, match="divisible by 32"):
        tfp8.ScaledLinear(torch.nn.Linear(16, 32), "mxfp4")


def test_master_weights_and_inputs_must_be_float32_in_both_trees() -> None:
    with pytest.raises(TypeError, match="float32"):
        rfp8.ScaledLinear(Linear(32, 8, rng=np.random.default_rng(0), dtype=np.float64),
                          "fp8-tensorwise")
    with pytest.raises(TypeError, match="float32"):
        tfp8.ScaledLinear(torch.nn.Linear(32, 8).double(), "fp8-tensorwise")
    layer = rfp8.ScaledLinear(Linear(32, 8, rng=np.random.default_rng(0)), "fp8-rowwise")
    with pytest.raises(ValueError, match="float32 input"):
        layer.forward(np.zeros((2, 32), dtype=np.float64))
    with pytest.raises(ValueError, match="float32 input"):
        tfp8.ScaledLinear(torch.nn.Linear(32, 8), "fp8-rowwise")(torch.zeros(2, 16))


def test_a_scaled_precision_trains_the_transformer_without_recomputation_only() -> None:
    with pytest.raises(ValueError, match="--model gpt"):
        TrainConfig(model="mlp", precision="fp8-delayed")
    with pytest.raises(ValueError, match="recompute"):
        TrainConfig(model="gpt", precision="mxfp8", recompute="selective")
    assert TrainConfig(model="gpt", precision="mxfp4").precision == "mxfp4"


def test_convert_scales_exactly_the_blocks_linears_in_both_trees() -> None:
    """c_attn, attn.c_proj, c_fc, mlp.c_proj of every block; lm_head stays float32."""
    from common.gpt_config import GPTConfig
    from parity.drivers.gpt import make_pair

    ref, twin = make_pair(GPTConfig(), np.float32, 0)
    paths = rfp8.convert(ref, "fp8-tensorwise")
    assert paths == tfp8.convert(twin, "fp8-tensorwise")
    assert len(paths) == 4 * GPTConfig().n_layer and not any("lm_head" in p for p in paths)
