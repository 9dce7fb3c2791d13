"""torch_impl.fp8_scaling's own contracts: the errors it names, and inputs left unmodified
(the trees' agreement is parity/test_fp8_scaling.py)."""

from __future__ import annotations

import pytest
import torch

from torch_impl import fp8_scaling as tfp8


def test_bad_input_is_refused_naming_the_problem() -> None:
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="fmt must be one of"):
        tfp8.current_scaling(x, "float16")
    with pytest.raises(ValueError, match="axis 2 out of range"):
        tfp8.tensor_amax(x, 2)
    with pytest.raises(ValueError, match="empty tensor"):
        tfp8.tensor_amax(torch.ones(0, 3))
    with pytest.raises(TypeError, match="floating-point tensor"):
        tfp8.tensor_amax(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="floating-point tensor"):
        tfp8.cast_to_fp8([1.0], torch.ones(()), "float8_e4m3fn")  # type: ignore[arg-type]
    h, s = torch.zeros(4, 2), torch.ones(2)
    with pytest.raises(ValueError, match="algo must be one of"):
        tfp8.delayed_update(h, s, "float8_e4m3fn", algo="mean")
    with pytest.raises(ValueError, match="history must be"):
        tfp8.delayed_update(h, torch.ones(3), "float8_e4m3fn")
    with pytest.raises(ValueError, match="order must be"):
        tfp8.delayed_scale(s, s, "float8_e4m3fn", order="docs")


def test_delayed_update_and_record_leave_their_inputs_as_they_were() -> None:
    """State is a value: an update returns new tensors, the caller's history is untouched."""
    h = torch.tensor([[4.0], [2.0], [1.0]])
    s = torch.ones(1)
    before_h, before_s = h.clone(), s.clone()
    new_h, new_s = tfp8.delayed_update(h, s, "float8_e4m3fn")
    recorded = tfp8.record_amax(new_h, torch.tensor([3.0]))
    assert torch.equal(h, before_h) and torch.equal(s, before_s)
    assert new_h[0].item() == 0.0 and recorded[0].item() == 3.0 and new_s.item() == 112.0
