"""torch_impl.nn against its own oracles: torch.autograd.gradcheck, documented torch behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torch_impl import nn as tnn
from torch_impl import saved_tensors as tsaved
from torch_impl import state_mapping as tstate


@pytest.mark.parametrize("activation", tnn.ACTIVATIONS)
def test_make_mlp_gradients_pass_gradcheck_in_float64(activation: str, device: str) -> None:
    """The factory's model has correct input and parameter gradients (gradcheck, float64)."""
    model = tnn.make_mlp((3, 5, 4, 2), activation, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64, device=device)
    x = torch.randn(4, 3, dtype=torch.float64, device=device,
                    generator=torch.Generator(device).manual_seed(1), requires_grad=True)
    params = tuple(model.parameters())

    def f(inp: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, dict(zip(
            (n for n, _ in model.named_parameters()), weights, strict=True)), (inp,))

    assert torch.autograd.gradcheck(f, (x, *(p.detach().requires_grad_(True) for p in params)))


@pytest.mark.parametrize("loss", [torch.nn.MSELoss(), torch.nn.CrossEntropyLoss()])
def test_losses_pass_gradcheck_in_float64(loss: torch.nn.Module, device: str) -> None:
    """The two losses the model trains with have correct gradients (gradcheck, float64)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen).to(device).requires_grad_(True)
    target = (torch.randn(5, 3, dtype=torch.float64, generator=gen)
              if isinstance(loss, torch.nn.MSELoss) else torch.tensor([0, 2, 1, 1, 0]))
    target = target.to(device)
    assert torch.autograd.gradcheck(lambda z: loss(z, target), (x,))


def test_make_mlp_draws_only_from_its_generator(device: str) -> None:
    """Building the model leaves the global RNGs untouched and gives, on any device, the
    weights the same seed gives on the CPU."""
    cuda = device != "cpu"
    with torch.random.fork_rng(devices=None if cuda else []):
        torch.manual_seed(0)
        before = torch.random.get_rng_state()
        before_cuda = torch.cuda.get_rng_state() if cuda else None
        a = tnn.make_mlp((8, 16, 4), generator=torch.Generator().manual_seed(3), device=device)
        assert torch.equal(torch.random.get_rng_state(), before)
        if cuda:
            assert torch.equal(torch.cuda.get_rng_state(), before_cuda)
    b = tnn.make_mlp((8, 16, 4), generator=torch.Generator().manual_seed(3))
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and va.device.type == torch.device(device).type
        assert torch.equal(va.cpu(), vb)


def test_init_is_torchs_default_distribution() -> None:
    """init_linear_ draws exactly what Linear.reset_parameters draws from the same RNG state."""
    gen = torch.Generator().manual_seed(5)
    layer = torch.nn.Linear(30, 20)
    tnn.init_linear_(layer, gen)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        expected = torch.nn.Linear(30, 20)  # reset_parameters from the global RNG
    assert torch.equal(layer.weight, expected.weight) and torch.equal(layer.bias, expected.bias)
    assert layer.weight.abs().max() <= 1 / math.sqrt(30)


def test_state_dict_conversion_round_trips_bits(device: str) -> None:
    """torch -> NumPy -> torch keeps keys, dtypes and every bit (NaN payloads included)."""
    state = {"0.weight": torch.tensor([[1.5, -0.0], [float("nan"), 3e-45]], device=device),
             "0.bias": torch.tensor([1e300, -1e-310], dtype=torch.float64, device=device)}
    back = tstate.state_dict_to_torch(tstate.state_dict_from_torch(state), device)
    assert list(back) == list(state)
    for key in state:
        assert back[key].dtype == state[key].dtype and back[key].device == state[key].device
        assert torch.equal(back[key].view(torch.int32 if back[key].dtype == torch.float32
                                          else torch.int64),
                           state[key].view(torch.int32 if state[key].dtype == torch.float32
                                           else torch.int64))
    assert isinstance(tstate.state_dict_from_torch(state)["0.bias"], np.ndarray)


def test_measure_saved_tensors_names_what_autograd_keeps(device: str) -> None:
    """The hook-based measurement reports torch's saved tensors per module, by grad_fn name
    (the CPU's: CUDA fuses dropout into a node that saves a bool mask)."""
    if device != "cpu":
        pytest.skip("CPU-specific: CUDA's fused dropout saves NativeDropoutBackward0's bool mask")
    model = tnn.make_mlp((4, 6, 2), "relu", 0.5, generator=torch.Generator().manual_seed(0))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        saved = tsaved.measure_saved_tensors(model, torch.ones(3, 4, requires_grad=True))
    assert [(s.module, s.name, s.shape, s.dtype, s.nbytes, s.is_parameter) for s in saved] == [
        ("0", "AddmmBackward0.mat1", (3, 4), "float32", 48, False),
        ("0", "AddmmBackward0.mat2", (4, 6), "float32", 96, True),
        ("1", "ReluBackward0.result", (3, 6), "float32", 72, False),
        ("2", "MulBackward0.other", (3, 6), "float32", 72, False),
        ("3", "AddmmBackward0.mat1", (3, 6), "float32", 72, False),
        ("3", "AddmmBackward0.mat2", (6, 2), "float32", 48, True),
    ]


def test_make_mlp_refuses_bad_arguments() -> None:
    """Too few sizes or an unknown activation are clear errors."""
    with pytest.raises(ValueError, match="sizes needs at least"):
        tnn.make_mlp((3,), generator=torch.Generator())
    with pytest.raises(ValueError, match="activation must be"):
        tnn.make_mlp((3, 2), "swish", generator=torch.Generator())
