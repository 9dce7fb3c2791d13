"""reference.nn against torch.nn: every layer, the losses, the saved tensors and the whole model.

Each layer runs on the same inputs, weights and incoming gradient on both sides; outputs,
input gradients and parameter gradients are held to the layer's claim (bits where the
arithmetic is the same, an eps-scaled bound where libm/SLEEF or BLAS order differ; see the
nn section of parity/tolerances.py). Dropout's generators differ, so torch's mask is read from
its saved noise and fed to the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.nn import (
    TORCH_DTYPE,
    activation_claims,
    activation_scales,
    ce_scales,
    linear_scales,
    loss_pair,
    mlp_forward_with_bound,
    mse_scale,
    run_ref,
    run_torch,
    saved_signature,
    to_numpy,
    to_torch,
    torch_activation_saved,
    torch_layerwise,
    torch_twin,
)
from parity.strategies import NN_DTYPES, examples, mlp_sizes, nn_arrays, nn_shapes
from parity.strategies.nn import nn_absorbing_logits, nn_absorbing_residuals
from reference import nn as ref
from torch_impl import nn as tnn
from torch_impl import saved_tensors as tsaved
from torch_impl import state_mapping as tstate

ACTIVATION_LAYERS = {"tanh": ref.Tanh, "gelu_tanh": lambda: ref.GELU("tanh"), "gelu": ref.GELU}

# The claims whose derivation rests on torch's CPU kernels (parity/claims/nn.py).
CPU_ONLY_ACTIVATIONS = (
    "the activation bounds are derived from SLEEF's 1-ulp tanh/exp/erf and the CPU kernels' "
    "operation order; CUDA's libdevice (2-ulp tanhf, erff, expf) and nvcc's FMA contraction "
    "are outside that derivation")
CPU_ONLY_DROPOUT = (
    "CUDA fuses dropout (native_dropout: a bool mask and a separately rounded scale), so "
    "neither the saved mask nor the rounding of NOTE [ Dropout mask ] is the CPU kernel's")


def test_linear_forward_and_backward_match_torch_linear_within_dot_product_bound(
        device: str) -> None:
    """A float32 Linear's output and weight gradient are within (k + 1) eps |A||B| of
    torch.nn.Linear's (the two BLAS sum in different orders)."""
    rng = np.random.default_rng(0)
    ref_layer = ref.Linear(16, 8, rng=rng)
    torch_layer = tnn.Linear(16, 8).to(device)
    torch_layer.load_state_dict(tstate.state_dict_to_torch(ref_layer.state_dict()))
    x = rng.standard_normal((4, 16)).astype(np.float32)  # (B, in)
    g = rng.standard_normal((4, 8)).astype(np.float32)  # (B, out): dL/dy
    ref_y = ref_layer.forward(x)  # (B, out)
    torch_y = torch_layer(torch.from_numpy(x).to(device))  # (B, out)
    ref_layer.backward(g)
    torch_y.backward(torch.from_numpy(g).to(device))
    s = linear_scales(ref_layer, x, g)  # the claim's S, per element
    assert_claim("nn.linear", actual=torch_y.detach(), expected=ref_y, scale=s["y"])
    assert_claim("nn.linear", actual=torch_layer.weight.grad, expected=ref_layer.weight.grad,
                 scale=s["weight"])


def skip_on_cuda(device: str, why: str) -> None:
    if device != "cpu":
        pytest.skip(f"CPU-specific claim: {why}")


def assert_layer(layer: ref.Module, x: np.ndarray, g: np.ndarray, y: np.ndarray,
                 dx: np.ndarray, grads: dict[str, np.ndarray], ty: np.ndarray,
                 tdx: np.ndarray, tgrads: dict[str, np.ndarray]) -> None:
    """Hold one layer's (y, dx, parameter grads) to torch's under the layer's claim."""
    where = f"({layer!r} {x.dtype})"
    if isinstance(layer, ref.Linear):
        s = linear_scales(layer, x, g)
        assert_claim("nn.linear", actual=ty, expected=y, context=f"{where} y", scale=s["y"])
        assert_claim("nn.linear", actual=tdx, expected=dx, context=f"{where} dx", scale=s["dx"])
        for key in grads:
            assert_claim("nn.linear", actual=tgrads[key], expected=grads[key],
                         context=f"{where} {key}", scale=s[key])
    elif isinstance(layer, ref.ReLU | ref.Dropout):
        cid = "nn.relu" if isinstance(layer, ref.ReLU) else "nn.dropout"
        assert_claim(cid, actual=ty, expected=y, context=f"{where} output")
        assert_claim(cid, actual=tdx, expected=dx, context=f"{where} input gradient")
    else:
        fwd, bwd = activation_claims(layer)
        s_fwd, s_bwd = activation_scales(layer, x, y, g)
        assert_claim(fwd, actual=ty, expected=y, context=f"{where} y", scale=s_fwd)
        assert_claim(bwd, actual=tdx, expected=dx, context=f"{where} dx", scale=s_bwd)


@given(dtype=st.sampled_from(NN_DTYPES), data=st.data())
def test_relu_matches_torch_bitwise_including_signed_zeros(device: str, dtype: type,
                                                           data: st.DataObject) -> None:
    """ReLU's output and input gradient have torch's exact bits, -0 and NaN included."""
    shape = data.draw(nn_shapes())
    x, g = data.draw(nn_arrays(shape, dtype)), data.draw(nn_arrays(shape, dtype))
    x.reshape(-1)[0] = data.draw(st.sampled_from((-0.0, 0.0, np.nan, -1.0, 1.0)))
    event("signed zero in input" if np.any((x == 0) & np.signbit(x)) else "no -0")
    layer = ref.ReLU()
    assert_layer(layer, x, g, *run_ref(layer, x, g),
                 *run_torch(tnn.ReLU(), x, g, device)[:3])


@pytest.mark.parametrize("name", sorted(ACTIVATION_LAYERS))
@given(dtype=st.sampled_from(NN_DTYPES), data=st.data())
@settings(examples(40))
def test_activation_matches_torch_within_derived_eps_bound(device: str, name: str, dtype: type,
                                                           data: st.DataObject) -> None:
    """Tanh and both GELUs stay within their claimed eps-scaled bounds, forward and backward."""
    skip_on_cuda(device, CPU_ONLY_ACTIVATIONS)
    shape = data.draw(nn_shapes())
    x, g = data.draw(nn_arrays(shape, dtype)), data.draw(nn_arrays(shape, dtype))
    layer = ACTIVATION_LAYERS[name]()
    assert_layer(layer, x, g, *run_ref(layer, x, g),
                 *run_torch(torch_twin(layer), x, g, device)[:3])


@given(dtype=st.sampled_from(NN_DTYPES), n_in=st.integers(1, 300), n_out=st.integers(1, 40),
       lead=nn_shapes(1, 2, 12), bias=st.booleans(), seed=st.integers(0, 2**32 - 1),
       data=st.data())
@settings(examples(40))
def test_linear_matches_torch_within_dot_product_bound(device: str, dtype: type, n_in: int,
                                                       n_out: int, lead: tuple[int, ...],
                                                       bias: bool, seed: int,
                                                       data: st.DataObject) -> None:
    """y, dx, dW, db differ from torch by at most (k + 1) eps |A||B| (BLAS order differs)."""
    layer = ref.Linear(n_in, n_out, bias, rng=np.random.default_rng(seed), dtype=dtype)
    x = data.draw(nn_arrays((*lead, n_in), dtype))
    g = data.draw(nn_arrays((*lead, n_out), dtype))
    assert_layer(layer, x, g, *run_ref(layer, x, g),
                 *run_torch(torch_twin(layer, device), x, g, device)[:3])


@given(dtype=st.sampled_from(NN_DTYPES), p=st.sampled_from((0.0, 0.1, 0.5, 0.9, 1.0)),
       seed=st.integers(0, 2**32 - 1), data=st.data())
@settings(examples(40))
def test_dropout_with_torchs_mask_is_bitwise_identical(device: str, dtype: type, p: float,
                                                       seed: int, data: st.DataObject) -> None:
    """Fed torch's keep-mask, Dropout's output and gradient equal torch's bits (any p)."""
    skip_on_cuda(device, CPU_ONLY_DROPOUT)
    shape = data.draw(nn_shapes())
    x, g = data.draw(nn_arrays(shape, dtype)), data.draw(nn_arrays(shape, dtype))
    layer = ref.Dropout(p, rng=np.random.default_rng(seed))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        ty, tdx, tgrads, keep = run_torch(tnn.Dropout(p), x, g)
    if 0 < p < 1:
        event("some dropped" if np.any(~keep) else "none dropped")
    assert_layer(layer, x, g, *run_ref(layer, x, g, keep), ty, tdx, tgrads)


@given(dtype=st.sampled_from(NN_DTYPES), seed=st.integers(0, 2**32 - 1), data=st.data())
@settings(examples(20))
def test_dropout_in_eval_is_the_identity_like_torch(device: str, dtype: type, seed: int,
                                                   data: st.DataObject) -> None:
    """In eval both Dropouts return the input unchanged and pass the gradient through."""
    x = data.draw(nn_arrays(data.draw(nn_shapes()), dtype))
    layer = ref.Dropout(0.5, rng=np.random.default_rng(seed)).eval()
    y, dx, _ = run_ref(layer, x, x)
    ty, tdx, _, _ = run_torch(tnn.Dropout(0.5).eval(), x, x, device)
    assert_claim("nn.dropout", actual=ty, expected=y)
    assert_claim("nn.dropout", actual=tdx, expected=dx)


@given(dtype=st.sampled_from(NN_DTYPES), reduction=st.sampled_from(("none", "sum", "mean")),
       shape=nn_shapes(1, 3), absorbing=st.booleans(), data=st.data())
@settings(examples(40))
def test_mse_loss_matches_torch_bits_elementwise_and_bound_reduced(
        device: str, dtype: type, reduction: str, shape: tuple[int, ...], absorbing: bool,
        data: st.DataObject) -> None:
    """MSE terms and gradients have torch's bits; reduced losses differ only by summation
    order, within the any-order bound (driven toward it by absorbing residuals)."""
    if absorbing:
        x, t = data.draw(nn_absorbing_residuals(shape, dtype)), np.zeros(shape, dtype)
    else:
        x, t = data.draw(nn_arrays(shape, dtype)), data.draw(nn_arrays(shape, dtype))
    loss, tloss, dx, tdx, _, _ = loss_pair("mse", x, t, np.random.default_rng(0), reduction,
                                           device)
    assert_claim("nn.mse_loss.elementwise", actual=tdx, expected=dx, context="(input gradient)")
    if reduction == "none":
        assert_claim("nn.mse_loss.elementwise", actual=tloss, expected=loss, context="(loss)")
    else:
        seen = assert_claim("nn.mse_loss.reduced", actual=tloss, expected=loss,
                            scale=mse_scale(reduction, x, t))
        target(seen, label=f"nn.mse_loss.reduced, absorbing={absorbing}")


@given(dtype=st.sampled_from(NN_DTYPES), reduction=st.sampled_from(("none", "sum", "mean")),
       batch=st.integers(0, 40), classes=st.integers(1, 50), seed=st.integers(0, 2**32 - 1),
       absorbing=st.booleans(), offset=st.sampled_from((0.0, 100.0, -3000.0)), data=st.data())
@settings(examples(40))
def test_cross_entropy_matches_torch_within_logsumexp_bound(
        device: str, dtype: type, reduction: str, batch: int, classes: int, seed: int,
        absorbing: bool, offset: float, data: st.DataObject) -> None:
    """Cross-entropy loss and gradient (2-D and 1-D logits) stay within the derived bound,
    also where the class sums absorb all but one term, and for logits with a large common
    offset (where (x - max) - log Z and x - (max + log Z) part)."""
    shape = (classes,) if batch == 0 else (batch, classes)
    x = data.draw(nn_absorbing_logits(shape, dtype) if absorbing else nn_arrays(shape, dtype))
    x = (x + dtype(offset)).astype(dtype)
    loss, tloss, dx, tdx, g, classes_t = loss_pair("ce", x, x, np.random.default_rng(seed),
                                                   reduction, device)
    s_loss, s_grad = ce_scales(reduction, x, classes_t, g, dx)
    seen = assert_claim("nn.cross_entropy", actual=tloss, expected=loss,
                        context=f"({reduction}, {shape}) loss", scale=s_loss)
    seen = max(seen, assert_claim("nn.cross_entropy", actual=tdx, expected=dx,
                                  context=f"({reduction}, {shape}) dx", scale=s_grad))
    target(seen, label=f"nn.cross_entropy, absorbing={absorbing}")


SAVED_LAYERS = {
    "Linear": lambda dtype: ref.Linear(7, 5, rng=np.random.default_rng(0), dtype=dtype),
    "ReLU": lambda dtype: ref.ReLU(), "Tanh": lambda dtype: ref.Tanh(),
    "GELU": lambda dtype: ref.GELU(), "GELU_tanh": lambda dtype: ref.GELU("tanh"),
    "Dropout": lambda dtype: ref.Dropout(0.3, rng=np.random.default_rng(0)),
    "Dropout_p1": lambda dtype: ref.Dropout(1.0, rng=np.random.default_rng(0)),
    "Dropout_eval": lambda dtype: ref.Dropout(0.3, rng=np.random.default_rng(0)).eval(),
}


@pytest.mark.parametrize("name", sorted(SAVED_LAYERS))
@pytest.mark.parametrize("dtype", NN_DTYPES)
@pytest.mark.parametrize("shape", [(4, 7), (2, 3, 7)])
def test_saved_tensors_have_torchs_shapes_dtypes_and_bytes(device: str, name: str,
                                                           dtype: type,
                                                           shape: tuple[int, ...]) -> None:
    """Each layer's tape holds what saved_tensors_hooks sees torch save (weights excluded)."""
    if name == "Dropout":
        skip_on_cuda(device, CPU_ONLY_DROPOUT)
    layer = SAVED_LAYERS[name](dtype)
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    layer.forward(x)
    twin = torch_twin(layer, device).train(layer.training)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        assert_claim("nn.saved_tensors", actual=torch_activation_saved(twin, x, device),
                     expected=saved_signature(layer.tape()), context=f"({name})")
    layer.backward(np.ones_like(layer.forward(x)))
    assert layer.tape() == []  # backward frees the tape


def test_linear_torch_also_saves_a_view_of_the_weight(device: str) -> None:
    """torch's addmm keeps weight.t() (a parameter view) besides the input; the tape does not."""
    layer = ref.Linear(7, 5, rng=np.random.default_rng(0), dtype=np.float64)
    tx = torch.zeros(4, 7, dtype=torch.float64, device=device, requires_grad=True)
    saved = tsaved.measure_saved_tensors(torch_twin(layer, device), tx)
    params = [s for s in saved if s.is_parameter]
    assert [(s.name, s.shape) for s in params] == [("AddmmBackward0.mat2", (7, 5))]


@given(dtype=st.sampled_from(NN_DTYPES), sizes=mlp_sizes(),
       activation=st.sampled_from(ref.ACTIVATIONS), seed=st.integers(0, 2**32 - 1))
@settings(examples(30))
def test_state_dict_round_trip_is_bitwise_and_keys_match_torch(
        device: str, dtype: type, sizes: list[int], activation: str, seed: int) -> None:
    """Reference -> torch -> reference keeps every bit; both factories name parameters alike."""
    model = ref.make_mlp(sizes, activation, 0.1, rng=np.random.default_rng(seed), dtype=dtype)
    twin = tnn.make_mlp(sizes, activation, 0.1, generator=torch.Generator().manual_seed(seed),
                        dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    assert list(model.state_dict()) == list(twin.state_dict())
    twin.load_state_dict(tstate.state_dict_to_torch(model.state_dict(), device))
    back = tstate.state_dict_from_torch(twin.state_dict())
    for key, value in model.state_dict().items():
        assert_claim("nn.state_dict_roundtrip", actual=back[key], expected=value, context=key)
    other = ref.make_mlp(sizes, activation, 0.1, rng=np.random.default_rng(seed + 1),
                         dtype=dtype)
    other.load_state_dict(back)
    for key, value in model.state_dict().items():
        assert_claim("nn.state_dict_roundtrip", actual=other.state_dict()[key], expected=value,
                     context=key)


@given(dtype=st.sampled_from(NN_DTYPES), sizes=mlp_sizes(), dropout=st.sampled_from((0.0, 0.3)),
       batch=st.integers(1, 16), seed=st.integers(0, 2**32 - 1), data=st.data())
@settings(examples(30))
def test_mlp_matches_torch_end_to_end_and_layer_by_layer(
        device: str, dtype: type, sizes: list[int], dropout: float, batch: int, seed: int,
        data: st.DataObject) -> None:
    """The model's output is within the propagated bound; each layer, fed torch's activations
    and incoming gradients, meets its own claim for outputs, input and parameter gradients.
    On CUDA only the claims that hold there are composed: ReLU, no Dropout."""
    cpu = device == "cpu"
    activation = data.draw(st.sampled_from(ref.ACTIVATIONS if cpu else ("relu",)))
    dropout = dropout if cpu else 0.0
    model = ref.make_mlp(sizes, activation, dropout, rng=np.random.default_rng(seed), dtype=dtype)
    twin = tnn.make_mlp(sizes, activation, dropout, generator=torch.Generator().manual_seed(0),
                        dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    twin.load_state_dict(tstate.state_dict_to_torch(model.state_dict(), device))
    x = data.draw(nn_arrays((batch, sizes[0]), dtype, max_magnitude=4.0))
    g = data.draw(nn_arrays((batch, sizes[-1]), dtype))
    with torch.random.fork_rng(devices=[] if cpu else None):
        torch.manual_seed(seed)
        acts, masks = torch_layerwise(twin, x, g)
    with torch.random.fork_rng(devices=[] if cpu else None):
        torch.manual_seed(seed)
        assert torch.equal(twin(to_torch(x, device)), acts[-1])  # Sequential == the loop
    y, bound = mlp_forward_with_bound(model, x, dict(enumerate(masks)))
    assert_claim("nn.mlp.forward", actual=to_numpy(acts[-1]), expected=y, scale=bound)
    for i, (layer, module) in enumerate(zip(model, twin, strict=True)):
        xi, gi = to_numpy(acts[i]), to_numpy(acts[i + 1].grad)
        tgrads = {k: to_numpy(p.grad) for k, p in module.named_parameters()}
        assert_layer(layer, xi, gi, *run_ref(layer, xi, gi, masks[i]), to_numpy(acts[i + 1]),
                     to_numpy(acts[i].grad), tgrads)


@given(dtype=st.sampled_from(NN_DTYPES), sizes=mlp_sizes(3, 16),
       activation=st.sampled_from(ref.ACTIVATIONS), batch=st.integers(1, 8))
@settings(examples(20))
def test_mlp_tape_matches_torchs_saved_tensors_module_by_module(
        device: str, dtype: type, sizes: list[int], activation: str, batch: int) -> None:
    """The model's tape lists, per module path, what torch saves for that module (with Dropout
    on the CPU only: CUDA's fused dropout saves a bool mask)."""
    dropout = 0.2 if device == "cpu" else 0.0
    model = ref.make_mlp(sizes, activation, dropout, rng=np.random.default_rng(0), dtype=dtype)
    twin = tnn.make_mlp(sizes, activation, dropout, generator=torch.Generator().manual_seed(0),
                        dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    x = np.ones((batch, sizes[0]), dtype=dtype)
    model.forward(x)
    with torch.random.fork_rng(devices=[] if device == "cpu" else None):
        torch.manual_seed(0)
        theirs = [s for s in tsaved.measure_saved_tensors(twin, to_torch(x, device, grad=True))
                  if not s.is_parameter]
    for path, _ in model.named_modules():
        mine = [s for s in model.tape() if s.module == path]
        assert_claim("nn.saved_tensors",
                     actual=saved_signature([s for s in theirs if s.module == path]),
                     expected=saved_signature(mine), context=f"(module {path})")
