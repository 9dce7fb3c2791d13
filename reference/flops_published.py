"""The published approximations of a decoder's training FLOPs, each beside the exact count
of the same configuration (reference/flops.py, NOTE [ FLOP conventions ]): Kaplan et al.'s
6 N D, PaLM's 6 N + 12 L H Q T per token, Chinchilla's appendix-F count. The exact count is
reference/flops.py's, imported here (it does not import this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from reference.flops import gpt_param_count, transformer_flops


def kaplan_flops(*, n_layer: int, d_model: int, seq_len: int, batch: int,
                 d_ff: int | None = None) -> int:
    """Kaplan et al. 2020 (Table 1): C = 6 N D, N = 2 h L (2 d_attn + f) non-embedding
    parameters (d_attn = h; no biases, no LayerNorm), D = B s tokens. Drops attention's
    s^2 term and the head."""
    f = 4 * d_model if d_ff is None else d_ff
    n = 2 * d_model * n_layer * (2 * d_model + f)
    return 6 * n * batch * seq_len


def palm_flops(*, n_params: int, n_layer: int, n_head: int, d_model: int, seq_len: int,
               batch: int) -> int:
    """Chowdhery et al. 2022 (PaLM, appendix B): (6 N + 12 L H Q T) per token, H heads of
    width Q, T = s, times D = B s tokens. N is the caller's: nanoGPT's estimate_mfu takes every
    parameter but the position embedding."""
    q = d_model // n_head
    return (6 * n_params + 12 * n_layer * n_head * q * seq_len) * batch * seq_len


def chinchilla_flops(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
                     batch: int, d_ff: int | None = None) -> int:
    """Hoffmann et al. 2022 (Chinchilla, appendix F), per sequence, times B, times 3:
    embeddings 2 s V h (a one-hot matmul), per layer 2*3 s h h + 2 s^2 h + 3 a s^2 (softmax)
    + 2 s^2 h + 2 s h h + 2 s (2 h f), logits 2 s h V; backward = 2 forward."""
    f = 4 * d_model if d_ff is None else d_ff
    s, h, a, V = seq_len, d_model, n_head, vocab
    attention = 2 * 3 * s * h * h + 2 * s * s * h + 3 * a * s * s + 2 * s * s * h + 2 * s * h * h
    dense = 2 * s * (h * f + h * f)
    forward = 2 * s * V * h + n_layer * (attention + dense) + 2 * s * h * V
    return 3 * forward * batch


@dataclass(frozen=True)
class Approximation:
    """A published estimate beside the exact count of the same configuration."""

    name: str
    formula: str
    flops: int
    exact: int

    @property
    def difference(self) -> int:
        return self.flops - self.exact

    @property
    def relative(self) -> Fraction:
        return Fraction(self.difference, self.exact)


def flop_approximations(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
                        batch: int, d_ff: int | None = None, block_size: int | None = None
                        ) -> list[Approximation]:
    """Kaplan's 6ND, PaLM's 6N + 12LHQT and Chinchilla's count against transformer_flops
    ("none"). PaLM's N: every parameter but wpe (bias on, untied head, block_size = s)."""
    cfg = {"n_layer": n_layer, "d_model": d_model, "seq_len": seq_len, "batch": batch}
    exact = transformer_flops(**cfg, n_head=n_head, vocab=vocab, d_ff=d_ff)
    block = seq_len if block_size is None else block_size
    n_palm = gpt_param_count(n_layer, d_model, vocab, block, d_ff) - block * d_model
    return [
        Approximation("Kaplan 2020", "6 N D, N = 12 L h^2", kaplan_flops(**cfg, d_ff=d_ff),
                      exact),
        Approximation("PaLM 2022", "(6 N + 12 L H Q T) D",
                      palm_flops(**cfg, n_params=n_palm, n_head=n_head), exact),
        Approximation("Chinchilla 2022", "appendix F, x3",
                      chinchilla_flops(**cfg, n_head=n_head, vocab=vocab, d_ff=d_ff), exact),
    ]
