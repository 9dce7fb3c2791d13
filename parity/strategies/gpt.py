"""Strategies for the compact transformer: small configs and a batch that fits them."""

from __future__ import annotations

from hypothesis import strategies as st

from reference.gpt import GPTConfig


@st.composite
def gpt_configs(draw: st.DrawFn, max_layers: int = 2, dropout: bool | None = None
                ) -> GPTConfig:
    """Layers 1..max_layers, heads dividing the width (head sizes 1..8), vocab 2..20,
    block_size 1..12, bias or not, tied or not, dropout 0 or in (0, 0.5] (or as asked)."""
    n_head = draw(st.integers(1, 3))
    n_embd = n_head * draw(st.sampled_from((1, 2, 4, 8)))
    with_dropout = draw(st.booleans()) if dropout is None else dropout
    return GPTConfig(
        vocab_size=draw(st.integers(2, 20)), block_size=draw(st.integers(1, 12)),
        n_layer=draw(st.integers(1, max_layers)), n_head=n_head, n_embd=n_embd,
        dropout=draw(st.sampled_from((0.1, 0.3, 0.5))) if with_dropout else 0.0,
        bias=draw(st.booleans()), tie_weights=draw(st.booleans()))


@st.composite
def gpt_batches(draw: st.DrawFn, config: GPTConfig) -> tuple[int, int, int]:
    """(batch, seq_len <= block_size, seed)."""
    return (draw(st.integers(1, 3)), draw(st.integers(1, config.block_size)),
            draw(st.integers(0, 2**32 - 1)))
