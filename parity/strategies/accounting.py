"""Hypothesis strategies for accounting (the conventions: parity/strategies/__init__.py).

Decoder configurations span one layer to GPT-3's depth, heads that divide the width (n_head
times a head width, never a width drawn alone), sequences from one token to past the width
(where attention's s^2 term overtakes the h^2 term), vocabularies from 1 to GPT-2's. MLP
steps cover every precision, optimizer, activation, dropout (none, some, p = 1 whose mask is
a 0-dim zero) and checkpoint schedule of the compact model.
"""

from __future__ import annotations

from hypothesis import strategies as st

ACCOUNTING_PRECISIONS = ("fp32", "bf16", "fp16")
ACCOUNTING_OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw")
ACCOUNTING_RECOMPUTE = ("none", "full", "full_early_stop")


@st.composite
def accounting_gpt_configs(draw: st.DrawFn, max_layers: int = 96) -> dict:
    """Keyword arguments of transformer_flops: n_head divides d_model by construction."""
    n_head = draw(st.integers(1, 32))
    d_model = n_head * draw(st.integers(1, 128))
    return {
        "n_layer": draw(st.integers(1, max_layers)),
        "d_model": d_model,
        "n_head": n_head,
        "seq_len": draw(st.integers(1, 8192)),
        "vocab": draw(st.integers(1, 50257)),
        "batch": draw(st.integers(1, 64)),
        "d_ff": draw(st.one_of(st.none(), st.integers(1, 4 * d_model + 64))),
        "recompute": draw(st.sampled_from(ACCOUNTING_RECOMPUTE)),
        "dropout": draw(st.sampled_from((0.0, 0.1))),
    }


@st.composite
def accounting_mlp_cases(draw: st.DrawFn, max_layers: int = 4, max_width: int = 12) -> dict:
    """One MLP training step: parity.drivers.accounting.MLPCase's fields."""
    from parity.strategies.recompute import recompute_specs

    sizes = tuple(draw(st.lists(st.integers(1, max_width), min_size=2,
                                max_size=max_layers + 1)))
    dropout = draw(st.sampled_from((0.0, 0.25, 1.0)))
    n_modules = (len(sizes) - 1) + (len(sizes) - 2) * (2 if dropout > 0 else 1)
    return {
        "sizes": sizes,
        "batch": draw(st.integers(1, 8)),
        "activation": draw(st.sampled_from(("relu", "tanh", "gelu", "gelu_tanh"))),
        "dropout": dropout,
        "precision": draw(st.sampled_from(ACCOUNTING_PRECISIONS)),
        "optimizer": draw(st.sampled_from(ACCOUNTING_OPTIMIZERS)),
        "recompute": draw(recompute_specs(n_modules)),
        "early_stop": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


@st.composite
def accounting_gpt_cases(draw: st.DrawFn, max_layers: int = 2) -> dict:
    """One step of the compact transformer: parity.drivers.accounting.GPTCase's fields, tiny
    (heads dividing the width by construction, seq_len <= block_size, the model's own
    d_ff = 4 d_model, bias on: this project's LayerNorms always carry one)."""
    n_head = draw(st.integers(1, 3))
    block_size = draw(st.integers(1, 9))
    return {
        "n_layer": draw(st.integers(1, max_layers)),
        "d_model": n_head * draw(st.integers(1, 4)),
        "n_head": n_head,
        "seq_len": draw(st.integers(1, block_size)),
        "block_size": block_size,
        "vocab": draw(st.integers(1, 13)),
        "batch": draw(st.integers(1, 3)),
        "tie_weights": draw(st.booleans()),
        "dropout": draw(st.sampled_from((0.0, 0.25))),
        "precision": draw(st.sampled_from(ACCOUNTING_PRECISIONS)),
        "optimizer": draw(st.sampled_from(ACCOUNTING_OPTIMIZERS)),
        "recompute": draw(st.sampled_from(ACCOUNTING_RECOMPUTE)),
    }
