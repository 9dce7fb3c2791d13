"""The random bits of a scaled precision on N ranks (`train --world-size N --model gpt
--precision nvfp4 | bf16-sr`): which BitStream each rank draws from, and its checkpoint key.
Plain data and one rule, shared by reference/ddp_gpt.py, torch_impl/ddp_gpt.py and both
ddp_train.py.

# NOTE [ Random bits on N ranks ]
The single-process run owns one BitStream (NOTE [ One bit stream, both trees ] in
common/recipes_train.py). On N ranks each rank owns one, by what its bits round:
1. bf16-sr rounds the UPDATE of the replicated weights: every rank's AdamWSR reads the same
   reduced gradient, and the replicas stay equal only if every rank also draws the same bits.
   So every rank's stream is the single-process run's, BitStream(seed): one shared stream,
   a replicated entry of the checkpoint ("bits"), loaded at any world size as the weights are.
   (torchao's _AdamW draws torch.randint(0, 1 << 16, ...) from the default generator: its
   DDP replicas stay equal only where every rank seeds that generator alike, the same rule.)
2. nvfp4 rounds each rank's LOCAL gradient g (its own shard's) before the grad_input and
   grad_weight GEMMs. Stochastic rounding is unbiased per draw; the reduced gradient is a
   mean over the ranks, and independent bits make the ranks' rounding errors independent,
   so their variance in the mean falls as 1/N; the same bits on every rank would correlate
   them (equal local values would round alike). So rank r draws from its own stream,
   BitStream(rank_seed(seed, r, 0)), a per-rank entry ("bits/rank<r>"), and on a resume at
   another world size it follows NOTE [ Resharding a DDP checkpoint ] as the dropout stream
   does: re-derived, BitStream(rank_seed(seed, r, step)).
At one rank the shared stream is the single-process run's; a per-rank one is not (it is
seeded by rank_seed), so a 1-rank nvfp4 run draws other bits than the single-process one.
"""

from __future__ import annotations

from ckpt.commit import rank_seed
from common.fp8_train import WEIGHT_PRECISIONS, needs_bits
from common.recipes_train import BitStream

SHARED = WEIGHT_PRECISIONS  # bf16-sr: one stream, the same on every rank


def shared(precision: str) -> bool:
    """Whether every rank of a run of `precision` draws the same bits (NOTE [ Random bits on
    N ranks ] 1); False for a per-rank stream or none."""
    return precision in SHARED


def bits_key(precision: str, rank: int) -> str:
    """The checkpoint key of rank `rank`'s BitStream state: "bits" (shared, replicated) or
    "bits/rank<r>" (per rank)."""
    return "bits" if shared(precision) else f"bits/rank{rank}"


def rank_bits(seed: int, precision: str, rank: int, step: int = 0) -> BitStream | None:
    """Rank `rank`'s BitStream at `step` by NOTE [ Random bits on N ranks ] (None: the
    precision draws none). A shared stream is BitStream(seed) at step 0 (later it is loaded,
    never re-derived); a per-rank one is seeded by rank_seed(seed, rank, step)."""
    if not needs_bits(precision):
        return None
    if shared(precision):
        return BitStream(seed)
    return BitStream(rank_seed(seed, rank, step))
