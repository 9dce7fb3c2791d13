"""Recomputation on the transformer with torch.utils.checkpoint. See reference/recompute_gpt.py
for the two mechanisms (per block, selective) and what each keeps and costs.

Same names as the reference. What PyTorch does differently or hides:
- Per block: GPT.forward hands its ModuleList of blocks to forward_with_schedule
  (torch_impl/recompute.py), which checkpoints the plan's segments; uniform:K goes through
  torch's checkpoint_sequential, which indexes a ModuleList as it does a Sequential.
- Selective: RecomputedCore's forward is `checkpoint(AttentionCore.forward, q, k, v,
  use_reentrant=False)`. The non-reentrant checkpoint saves q, k and v (three views of the
  qkv Linear's output: an outer saved_tensors_hooks sees one storage) and runs the core
  under its own hooks; backward recomputes it on the first unpack, with the RNG of the
  inputs' device replayed and the forward's autocast state re-entered. The recompute calls
  the core's forward directly, so the core's own module hooks fire once (in forward), its
  dropout's again in the recompute; the reference does the same.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from common.recompute_plans import split_recompute  # plain data: the spec's words
from torch_impl.attention import AttentionCore
from torch_impl.gpt import GPT
from torch_impl.recompute_plans import parse_schedule


class RecomputedCore(AttentionCore):
    """The attention core checkpointed on its own: torch keeps q, k, v and recomputes."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch_checkpoint(super().forward, q, k, v, use_reentrant=False,
                                preserve_rng_state=True)


def recompute_attention_cores(model: GPT, on: bool = True) -> None:
    """Swap every block's attention core for a RecomputedCore (or back, `on=False`); the
    module keeps its name, so parameter and hook paths do not change."""
    for block in model.transformer.h:
        attn, old = block.attn, block.attn.core
        kind = RecomputedCore if on else AttentionCore
        if type(old) is kind:
            continue
        attn.core = kind(old.block_size, old.attn_dropout.p, old.attention).train(old.training)


def set_recompute(model: GPT, spec: str) -> GPT:
    """Recompute `model` per `spec`: a block schedule ("none", "sqrt", "uniform:K",
    "optimal:S", over the n_layer blocks), "selective", or "SPEC+selective"; returns it."""
    if not isinstance(model, GPT):
        raise TypeError(f"set_recompute: model must be a torch_impl.gpt.GPT, "
                        f"got {type(model).__name__}")
    blocks, selective = split_recompute(spec)
    schedule = parse_schedule(blocks, model.config.n_layer)
    model.schedule = None if blocks == "none" else schedule
    recompute_attention_cores(model, selective)
    return model
