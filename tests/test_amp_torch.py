"""torch.autocast against its documented behaviour: which ops of the compact model run in low
precision on each device type, that master weights and their grads stay float32, and that
the cast's backward (ToCopyBackward0) rounds a float32 gradient to lp once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_impl import amp
from torch_impl import nn as tnn

LP = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LP)
def test_lower_precision_fp_list_covers_the_models_matmuls(dtype: torch.dtype,
                                                           device: str) -> None:
    """linear, addmm, mm, matmul, bmm give lp outputs; mv and addmv only on CUDA."""
    g = torch.Generator().manual_seed(0)
    a, b, v = (torch.randn(4, 4, generator=g).to(device), torch.randn(4, 4, generator=g).to(
        device), torch.randn(4, generator=g).to(device))
    device_type = torch.device(device).type
    with amp.autocast(dtype, device_type):
        lp = [F.linear(a, b, v), torch.addmm(v, a, b), torch.mm(a, b), torch.matmul(a, b),
              torch.bmm(a[None], b[None])]
        mv = [torch.mv(a, v), torch.addmv(v, a, v)]
    assert all(t.dtype == dtype for t in lp)
    assert all(t.dtype == (dtype if device_type == "cuda" else torch.float32) for t in mv)


@pytest.mark.parametrize("dtype", LP)
def test_losses_run_in_float32_and_activations_keep_their_input_dtype(dtype: torch.dtype,
                                                                       device: str) -> None:
    """mse_loss and cross_entropy return float32; gelu/tanh/relu keep lp."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    with amp.autocast(dtype, torch.device(device).type):
        assert F.mse_loss(x, torch.zeros(3, 5, device=device)).dtype == torch.float32
        target = torch.zeros(3, dtype=torch.long, device=device)
        assert F.cross_entropy(x, target).dtype == torch.float32
        assert {F.gelu(x).dtype, torch.tanh(x).dtype, F.relu(x).dtype} == {dtype}


@pytest.mark.parametrize("dtype", LP)
def test_master_weights_and_their_grads_stay_float32(dtype: torch.dtype, device: str) -> None:
    """Under autocast the parameters are not modified and .grad arrives in float32."""
    layer = torch.nn.Linear(4, 3).to(device)
    before = layer.weight.detach().clone()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2)).to(device)
    with amp.autocast(dtype, torch.device(device).type):
        y = layer(x)
    y.float().sum().backward()
    assert layer.weight.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    assert torch.equal(layer.weight.detach(), before)
    assert torch.equal(layer.weight.grad, layer.weight.grad.to(dtype).float())  # lp values


@pytest.mark.parametrize("dtype", LP)
def test_cast_backward_rounds_the_float32_gradient_once(dtype: torch.dtype,
                                                        device: str) -> None:
    """A float32 gradient through the lp output's float32 cast gives the parameter gradients
    that its lp rounding gives directly: the backward rounds the incoming gradient first."""
    gen = torch.Generator().manual_seed(3)
    model = tnn.make_mlp((6, 16, 3), "tanh", generator=gen).to(device)
    x = torch.randn(4, 6, generator=gen).to(device)
    g = torch.randn(4, 3, generator=gen).to(device)  # float32: 24 significant bits
    assert not torch.equal(g, g.to(dtype).float()), "the gradient must need the rounding"
    with amp.autocast(dtype, torch.device(device).type):
        out = model(x)
    via_cast = torch.autograd.grad(out.float(), list(model.parameters()), g, retain_graph=True)
    direct = torch.autograd.grad(out, list(model.parameters()), g.to(dtype))
    for a, b in zip(via_cast, direct, strict=True):
        assert torch.equal(a, b)


def test_precision_names_map_to_dtypes_and_bad_names_are_refused() -> None:
    """fp32 -> no autocast, bf16/fp16 -> their dtypes; anything else is a ValueError."""
    assert [amp.autocast_dtype(p) for p in ("fp32", "bf16", "fp16")] == [
        None, torch.bfloat16, torch.float16]
    with pytest.raises(ValueError, match="precision must be one of"):
        amp.autocast_dtype("fp8")
    with amp.autocast(None):
        assert not torch.is_autocast_enabled("cpu")
