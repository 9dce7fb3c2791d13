"""Recomputation on the transformer: per-block checkpointing and the selective attention core.

Two ways to trade compute for memory on reference/gpt.py's model, alone or together (the
spec of `set_recompute`, split by recompute_plans.split_recompute):

    per block    the n_layer blocks are the layers of a plan (recompute_plans.parse_schedule:
                 uniform:K, sqrt, optimal:S over blocks); a checkpointed block keeps only
                 its input x (B, T, C), and backward re-runs it (reference/recompute.py)
    selective    in every block the attention core, scores -> mask -> softmax -> dropout
                 -> @ v, is checkpointed on its own: it keeps q, k, v (three views of the
                 qkv Linear's output, one (B, T, 3C) buffer) instead of q, k^T, v copies,
                 the mask, the (B, nh, T, T) probabilities and their dropout; backward
                 re-runs the core alone. What grows with T^2 is what goes; everything else
                 (the Linears, LayerNorms, GELU, the residual dropouts) stays on the tape.

The recompute replays the core's generator and re-enters the autocast state of its forward,
as a Checkpoint does (NOTE [ RNG replay ] in reference/recompute.py, NOTE [ Autocast state ]
in reference/amp.py), so the gradients are bit-identical to no recomputation, dropout on.
Extra work: per-block recomputes each checkpointed block's forward once more (R blocks,
recompute_plans' counting); selective adds one core forward per block: 2 (B nh) T T hs
multiply-adds twice (the two bmms), about 4 B T^2 C FLOPs, against 24 B T C^2 + 4 B T^2 C
for a whole block's forward.
"""

from __future__ import annotations

import copy

import numpy as np

from common.recompute_plans import split_recompute
from reference import amp
from reference.attention import AttentionCore
from reference.gpt import GPT
from reference.recompute_plans import parse_schedule


class RecomputedCore(AttentionCore):
    """The attention core checkpointed on its own: saves q, k, v; backward recomputes.

    Forward stashes the generators' states and the autocast state, runs the core, frees the
    core's tape (its dropout's mask included) and keeps its three inputs. Backward restores
    the stashed states, re-runs the core's forward on a fresh tape under the recorded
    autocast state, puts the generators back, and back-propagates through that tape.
    """

    def __init__(self, block_size: int, dropout: float, *, rng: np.random.Generator) -> None:
        super().__init__(block_size, dropout, rng=rng)
        self.stashed: list[dict] = []
        self.autocast = amp.autocast_state()
        self.recomputes = 0

    def __repr__(self) -> str:
        return "RecomputedCore()"

    def _generators(self) -> list[np.random.Generator]:
        unique: dict[int, np.random.Generator] = {}
        for g in self.generators().values():
            unique.setdefault(id(g), g)
        return list(unique.values())

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        self.stashed = [copy.deepcopy(g.bit_generator.state) for g in self._generators()]
        self.autocast = amp.autocast_state()
        y = super().forward(q, k, v)
        self.free_saved()  # the core's tape and its dropout's go; q, k, v stay
        self.save_for_backward({"q": q, "k": k, "v": v})
        return y

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        saved = self.pop_saved()
        generators = self._generators()
        now = [copy.deepcopy(g.bit_generator.state) for g in generators]
        for g, state in zip(generators, self.stashed, strict=True):
            g.bit_generator.state = copy.deepcopy(state)
        try:
            with amp.autocast.entering(self.autocast):  # the core's forward without its
                # own module hooks (its children's fire), as torch's checkpoint calls it
                AttentionCore.forward.__wrapped__(self, saved["q"], saved["k"], saved["v"])
        finally:
            for g, state in zip(generators, now, strict=True):
                g.bit_generator.state = state
        self.recomputes += 1
        return super().backward(grad_output)


def recompute_attention_cores(model: GPT, on: bool = True) -> None:
    """Swap every block's attention core for a RecomputedCore (or back, `on=False`); the
    module keeps its name, so parameter and tape paths do not change."""
    for block in model.transformer.h.children():
        attn, old = block.attn, block.attn.core
        kind = RecomputedCore if on else AttentionCore
        if type(old) is kind:
            continue
        new = kind(old.block_size, old.attn_dropout.p, rng=old.attn_dropout.rng)
        new.train(old.training)
        attn.core = new


def set_recompute(model: GPT, spec: str) -> GPT:
    """Recompute `model` per `spec`: a block schedule ("none", "sqrt", "uniform:K",
    "optimal:S", over the n_layer blocks), "selective", or "SPEC+selective"; returns it."""
    if not isinstance(model, GPT):
        raise TypeError(f"set_recompute: model must be a reference.gpt.GPT, "
                        f"got {type(model).__name__}")
    blocks, selective = split_recompute(spec)
    schedule = parse_schedule(blocks, model.config.n_layer)
    model.schedule = None if blocks == "none" else schedule
    recompute_attention_cores(model, selective)
    return model
