"""Hypothesis strategies for recompute (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

# Checkpointing schedules for a Sequential of n layers: every spec kind, with K over its
# whole range 1..n (K = 1: nothing checkpointed; K = n: every segment one layer) and S from 1
# (only the input stored: the quadratic extreme) to past n - 1 (every state storable).
RECOMPUTE_KINDS = ("none", "sqrt", "uniform", "optimal")


@st.composite
def recompute_specs(draw: st.DrawFn, n_layers: int) -> str:
    """A schedule spec valid for n_layers: "none", "sqrt", "uniform:K" or "optimal:S"."""
    kind = draw(st.sampled_from(RECOMPUTE_KINDS))
    if kind == "uniform":
        return f"uniform:{draw(st.integers(1, n_layers))}"
    if kind == "optimal":
        return f"optimal:{draw(st.integers(1, n_layers + 1))}"
    return kind


def recompute_models() -> st.SearchStrategy[dict]:
    """make_mlp arguments: 0-5 hidden layers (1-16 modules), dropout on or off, any activation,
    in training or eval mode (in eval a Dropout saves nothing: a segment may then end in
    layers that save nothing, which early stop does not re-run)."""
    return st.fixed_dictionaries({
        "sizes": st.lists(st.integers(1, 12), min_size=2, max_size=7),
        "activation": st.sampled_from(("relu", "tanh", "gelu_tanh", "gelu")),
        "dropout": st.sampled_from((0.0, 0.2, 0.5)),
        "training": st.booleans(),
        "dtype": st.sampled_from((np.float32, np.float64)),
        "batch": st.integers(1, 6),
        "seed": st.integers(0, 2**32 - 1),
    })
