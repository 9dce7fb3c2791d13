"""torch_impl.loss_scaling against torch's documented GradScaler behaviour: the skipped-step
signal agrees with what update() then does to the scale, and fp16 needs a scaler."""

from __future__ import annotations

import pytest
import torch

from torch_impl import loss_scaling as tls
from torch_impl import nn as tnn
from torch_impl import train as ttrain


def _setup(precision: str, **kwargs: float) -> tuple:
    model = tnn.make_mlp((4, 8, 1), "gelu", generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    return model, opt, tls.make_scaler(precision, **kwargs), x, y


def test_skipped_signal_matches_the_backoff_torch_then_applies() -> None:
    """A step is reported skipped exactly when update() backs the scale off (growth off)."""
    model, opt, scaler, x, y = _setup("fp16", init_scale=2.0**40, growth_interval=10**6)
    seen = []
    for _ in range(40):
        before = [p.detach().clone() for p in model.parameters()]
        r = ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="fp16")
        moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before,
                                                          strict=True))
        assert r.skipped is (scaler.get_scale() < r.scale) is (not moved)
        seen.append(r.skipped)
    assert any(seen) and not all(seen), "the run needs both skipped and taken steps"


def test_fp16_without_an_enabled_scaler_is_refused_and_bf16_needs_none() -> None:
    """precision fp16 with make_scaler('fp32') raises; bf16 trains with a disabled scaler."""
    model, opt, scaler, x, y = _setup("fp32")
    with pytest.raises(ValueError, match="needs an enabled GradScaler"):
        ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="fp16")
    model, opt, scaler, x, y = _setup("bf16")
    r = ttrain.train_step(model, torch.nn.MSELoss(), opt, scaler, x, y, precision="bf16")
    assert not scaler.is_enabled() and r.scale == 1.0 and not r.skipped
