"""torch.autocast on CPU against what reference/amp.py documents for torch 2.13: which ops
run in low precision, which in float32, and that master weights and their grads stay float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_impl import amp

LP = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", LP)
def test_cpu_lower_precision_fp_list_covers_the_models_matmuls(dtype: torch.dtype) -> None:
    """linear, addmm, mm, matmul, bmm give lp outputs; mv and addmv (CUDA-only list) do not."""
    g = torch.Generator().manual_seed(0)
    a, b, v = (torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g),
               torch.randn(4, generator=g))
    with amp.autocast(dtype):
        lp = [F.linear(a, b, v), torch.addmm(v, a, b), torch.mm(a, b), torch.matmul(a, b),
              torch.bmm(a[None], b[None])]
        fp32 = [torch.mv(a, v), torch.addmv(v, a, v)]
    assert all(t.dtype == dtype for t in lp)
    assert all(t.dtype == torch.float32 for t in fp32)


@pytest.mark.parametrize("dtype", LP)
def test_losses_run_in_float32_and_activations_keep_their_input_dtype(dtype: torch.dtype
                                                                       ) -> None:
    """mse_loss and cross_entropy (fp32 list) return float32; gelu/tanh/relu keep lp."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(dtype)
    with amp.autocast(dtype):
        assert F.mse_loss(x, torch.zeros(3, 5)).dtype == torch.float32
        assert F.cross_entropy(x, torch.zeros(3, dtype=torch.long)).dtype == torch.float32
        assert {F.gelu(x).dtype, torch.tanh(x).dtype, F.relu(x).dtype} == {dtype}


@pytest.mark.parametrize("dtype", LP)
def test_master_weights_and_their_grads_stay_float32(dtype: torch.dtype) -> None:
    """Under autocast the parameters are not modified and .grad arrives in float32."""
    layer = torch.nn.Linear(4, 3)
    before = layer.weight.detach().clone()
    with amp.autocast(dtype):
        y = layer(torch.randn(2, 4, generator=torch.Generator().manual_seed(2)))
    y.float().sum().backward()
    assert layer.weight.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    assert torch.equal(layer.weight.detach(), before)
    assert torch.equal(layer.weight.grad, layer.weight.grad.to(dtype).float())  # lp values


def test_precision_names_map_to_dtypes_and_bad_names_are_refused() -> None:
    """fp32 -> no autocast, bf16/fp16 -> their dtypes; anything else is a ValueError."""
    assert [amp.autocast_dtype(p) for p in ("fp32", "bf16", "fp16")] == [
        None, torch.bfloat16, torch.float16]
    with pytest.raises(ValueError, match="precision must be one of"):
        amp.autocast_dtype("fp8")
    with amp.autocast(None):
        assert not torch.is_autocast_enabled("cpu")
