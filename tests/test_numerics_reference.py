"""The reference's global hooks (NOTE [ Hooks wrap forward and backward ]) and its detector,
against their own contracts."""

from __future__ import annotations

import numpy as np
import pytest

from reference import faults
from reference import numerics as r_numerics
from reference.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
)
from reference.nn import Tanh, make_mlp


class TanhViaSuper(Tanh):
    def forward(self, x: np.ndarray) -> np.ndarray:
        return super().forward(x)


def test_hooks_fire_once_per_node_even_through_super_and_stop_when_removed() -> None:
    """Rule 2: a subclass calling super().forward fires the hooks once; remove() ends them."""
    calls: list[str] = []
    handles = [register_module_forward_pre_hook(lambda n, a: calls.append(f"pre {n!r}")),
               register_module_forward_hook(lambda n, a, o: calls.append(f"post {n!r}")),
               register_module_full_backward_hook(lambda n, gi, go: calls.append(f"back {n!r}"))]
    layer = TanhViaSuper()
    layer.backward(layer.forward(np.zeros(3, np.float32)))
    for h in handles:
        h.remove()
    layer.backward(layer.forward(np.zeros(3, np.float32)))
    assert calls == ["pre Tanh()", "post Tanh()", "back Tanh()"]


def test_a_hook_sees_the_output_the_caller_gets() -> None:
    model = make_mlp((4, 5, 2), "tanh", rng=np.random.default_rng(0))
    outputs: list[np.ndarray] = []
    handle = register_module_forward_hook(lambda n, a, o: outputs.append(o))
    try:
        y = model.forward(np.ones((3, 4), np.float32))
    finally:
        handle.remove()
    assert len(outputs) == 4 and outputs[-1] is y  # 3 layers, then the Sequential


def test_thresholds_are_the_format_ties() -> None:
    """float16: max 65504 + ulp/2 = 65520 and 2^-24 / 2 = 2^-25 (the docstring's numbers)."""
    from common.format_spec import get_format

    assert r_numerics.thresholds(get_format("float16")) == (65520.0, float.fromhex("0x1p-25"))


def test_an_unknown_fault_names_the_catalogue() -> None:
    with pytest.raises(ValueError, match="weight_overflow, inf_weight, poisoned_batch"):
        faults.fault_named("nope")
    model = make_mlp((4, 2), "tanh", rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"no parameter 2\.weight"):
        faults.apply_fault(model, faults.FAULTS["inf_weight"], (None, None))
