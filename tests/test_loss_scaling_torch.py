"""torch_impl.loss_scaling against torch's documented GradScaler behaviour: the skipped-step
signal agrees with what update() then does to the scale, fp16 needs a scaler, and the names
the reference exports are torch's own objects."""

from __future__ import annotations

import pytest
import torch

from torch_impl import loss_scaling as tls
from torch_impl import nn as tnn
from torch_impl import train as ttrain


def _setup(precision: str, device: str, **kwargs: float) -> tuple:
    model = tnn.make_mlp((4, 8, 1), "gelu", generator=torch.Generator().manual_seed(0))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g).to(device), torch.randn(16, 1, generator=g).to(device)
    return model, opt, tls.make_scaler(precision, device, **kwargs), x, y


def test_skipped_signal_matches_the_backoff_torch_then_applies(device: str) -> None:
    """A step is reported skipped exactly when update() backs the scale off (growth off)."""
    model, opt, scaler, x, y = _setup("fp16", device, init_scale=2.0**40,
                                      growth_interval=10**6)
    seen = []
    for _ in range(40):
        before = [p.detach().clone() for p in model.parameters()]
        r = ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="fp16")
        moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before,
                                                          strict=True))
        assert r.skipped is (scaler.get_scale() < r.scale) is (not moved)
        seen.append(r.skipped)
    assert any(seen) and not all(seen), "the run needs both skipped and taken steps"


def test_fp16_without_an_enabled_scaler_is_refused_and_bf16_needs_none(device: str) -> None:
    """precision fp16 with make_scaler('fp32') raises; bf16 trains with a disabled scaler."""
    model, opt, scaler, x, y = _setup("fp32", device)
    with pytest.raises(ValueError, match="needs an enabled GradScaler"):
        ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="fp16")
    model, opt, scaler, x, y = _setup("bf16", device)
    r = ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="bf16")
    assert not scaler.is_enabled() and r.scale == 1.0 and not r.skipped


def test_the_reference_names_are_torchs_own_objects() -> None:
    """GradScaler, OptState and the three clipping functions are torch's, under the names
    reference/loss_scaling.py exports."""
    assert tls.GradScaler is torch.amp.GradScaler
    assert tls.clip_grad_norm_ is torch.nn.utils.clip_grad_norm_
    assert tls.get_total_norm is torch.nn.utils.get_total_norm
    assert tls.clip_grads_with_norm_ is torch.nn.utils.clip_grads_with_norm_
    assert [s.name for s in tls.OptState] == ["READY", "UNSCALED", "STEPPED"]
