"""The compact transformer's shape: plain data that both trees read (no computation here).

torch_impl/gpt.py imports this module, as it imports common/format_spec.py: a shared
description, not a shared computation, so parity between the trees stays two computations.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION = ("explicit", "sdpa")


@dataclass(frozen=True)
class GPTConfig:
    """The transformer's shape; the same fields in torch_impl (which alone runs "sdpa")."""

    vocab_size: int = 12
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = False
    attention: str = "explicit"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_head={self.n_head} must divide "
                             f"n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTION:
            raise ValueError(f"GPTConfig: attention must be one of {ATTENTION}, "
                             f"got {self.attention!r}")


# What `python -m parity train --model gpt` trains (reference/train_models.py): the default
# shape with 4 blocks (the run's dropout replaces 0), on the copy task of TRAIN_COPY_PREFIX
# digits, a separator and the digits again: 2 P input tokens, the block size.
TRAIN_SHAPE = GPTConfig(n_layer=4)
TRAIN_COPY_PREFIX = TRAIN_SHAPE.block_size // 2
