"""The cross-rank check, once: after every step each rank contributes (found_inf, scale,
digest of scale and parameters); the ranks all-gather them (torch: dist.all_gather_object;
the reference: a list over its simulated ranks) and every rank runs `divergence` on the same
list, so every rank reaches the same verdict at the same step.

Data-parallel ranks must hold the same state after every step: they start equal and apply
the same reduced gradient. A rank whose scaler alone found inf/NaN skips its step and halves
its scale while the others step (reference/ddp_scaler.py, NOTE [ found_inf is per rank ]);
nothing in DDP notices, and from then on the ranks train different models. The first step
whose digests differ is where it happened; the found_inf column says which rank skipped.

    digest      SHA-256 over records (NOTE [ Canonical state digest ]'s record layout):
                "scale" as float32, then "param/<i>" for every parameter in order
    divergence  None while every rank's digest is rank 0's; else the message naming the step,
                the ranks that part from the rest and each rank's found_inf and scale: where
                some ranks skipped and others stepped, the fewer of the two (a tie: those
                that skipped); else the ranks whose digest is not the majority's (a tie:
                those not on rank 0's side)
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from common.state_digest import _record


class RankDivergence(RuntimeError):
    """The ranks' states parted (the message names the step and the ranks)."""


@dataclass(frozen=True)
class RankState:
    """What one rank contributes after one step: the found_inf its scaler.step used, its
    scale after update, and digest(scale, parameters)."""

    found_inf: float
    scale: float
    digest: str


def digest(scale: float, params: Iterable[np.ndarray]) -> str:
    """SHA-256 of the scale (as float32) and the parameters' dtypes, shapes and bytes."""
    h = hashlib.sha256()
    h.update(_record("scale", np.float32(scale), np.asarray))
    for i, p in enumerate(params):
        h.update(_record(f"param/{i}", p, np.asarray))
    return h.hexdigest()


def check_fault(fault: tuple[int, int] | None, world_size: int) -> None:
    """ValueError unless `fault` is None or (rank, step): 0 <= rank < ws, step >= 1 (the
    seeded fault: that rank's reduced gradient made non-finite at that step)."""
    if fault is None:
        return
    if (not isinstance(fault, tuple) or len(fault) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in fault)
            or not 0 <= fault[0] < world_size or fault[1] < 1):
        raise ValueError(f"fault must be None or (rank, step) with 0 <= rank < {world_size} "
                         f"and step >= 1, got {fault!r}")


def _odd(values: Sequence[object]) -> list[int]:
    """The ranks whose value is not the majority's (ties: rank 0's value is the majority)."""
    counts = Counter(values)
    best = max(counts.values())
    majority = values[0] if counts[values[0]] == best else next(
        v for v in values if counts[v] == best)
    return [r for r, v in enumerate(values) if v != majority]


def divergence(step: int, states: Sequence[RankState]) -> str | None:
    """None if every rank holds rank 0's digest; else why not, naming `step` and the ranks."""
    if not states:
        raise ValueError("divergence: need one RankState per rank, got none")
    if all(s.digest == states[0].digest for s in states):
        return None
    skipped = [r for r, s in enumerate(states) if s.found_inf != 0]
    stepped = [r for r, s in enumerate(states) if s.found_inf == 0]
    if skipped and stepped:  # name the fewer; a tie names the ranks that skipped
        odd, how = ((skipped, "found inf/NaN alone and skipped its step")
                    if len(skipped) <= len(stepped)
                    else (stepped, "found no inf/NaN and stepped where the others skipped"))
    else:
        odd, how = _odd([s.digest for s in states]), "holds other parameters or scale"
    who = f"rank {odd[0]}" if len(odd) == 1 else f"ranks {odd}"
    return (f"ranks diverge at step {step}: {who} {how} (found_inf per rank "
            f"{[float(s.found_inf) for s in states]}, scale per rank "
            f"{[float(s.scale) for s in states]})")


def check(step: int, states: Sequence[RankState]) -> None:
    """RankDivergence with divergence's message if the ranks parted at `step`."""
    message = divergence(step, states)
    if message is not None:
        raise RankDivergence(message)
