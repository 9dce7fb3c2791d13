"""Parity of reference.amp (autocast emulation) with torch.autocast on CPU, op by op and for
the whole compact model. Drivers are in parity/checks/amp.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.checks.amp import ACTIVATIONS, SUFFIX, activation_pairs, linear_pairs, model_pairs
from parity.compare import assert_claim

FMTS = st.sampled_from(["bfloat16", "float16"])


@settings(max_examples=25)
@given(fmt=FMTS, n=st.integers(1, 40), k=st.integers(1, 96), m=st.integers(1, 24),
       seed=st.integers(0, 2**32 - 1))
def test_linear_under_autocast_within_one_lp_ulp_of_torch(fmt: str, n: int, k: int, m: int,
                                                          seed: int) -> None:
    """Output and all three gradients within 1 lp ulp; casts and master weights bit-identical."""
    for label, a, b, ok in linear_pairs(fmt, n, k, m, seed):
        if label.startswith(("saved", "master")):
            assert_claim("amp.casts", a, b, label)
            continue
        event(f"{label}: precondition excluded {'some' if not ok.all() else 'none'}")
        assert_claim(f"amp.linear_{SUFFIX[fmt]}", a[ok], b[ok], label)


@settings(max_examples=20)
@given(fmt=FMTS, name=st.sampled_from(sorted(ACTIVATIONS)), seed=st.integers(0, 2**32 - 1))
def test_activations_on_lp_tensors_within_one_lp_ulp_of_torch(fmt: str, name: str,
                                                              seed: int) -> None:
    """Forward output and input gradient within 1 lp ulp where the float32 bound allows."""
    for label, a, b, ok in activation_pairs(name, fmt, 512, seed):
        assert ok.mean() > 0.5, "the precondition excluded most elements: little was tested"
        assert_claim(f"amp.activation_{SUFFIX[fmt]}", a[ok], b[ok], f"{name} {label}")


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("activation", ["gelu", "tanh", "relu"])
def test_compact_model_under_autocast_matches_torch(fmt: str, activation: str) -> None:
    """Output and parameter gradients of the whole model within amp.model's bound."""
    for label, a, b in model_pairs(activation, fmt, seed=0):
        assert np.all(np.isfinite(b)), label
        assert_claim("amp.model", a, b, label)
