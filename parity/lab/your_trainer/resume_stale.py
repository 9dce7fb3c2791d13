"""A state_dict() that does not follow its trainer: the resume check's guard against a state
built once and returned again (resume_check.py calls it on the uninterrupted run's digests).

NOTE [ A state that does not move ]
The verdict compares the two runs' final states. A trainer whose state_dict() hands back the
dict it built at its first call (a cached, staged copy of the model and optimizer, as a
checkpoint path caches what it stages) saves that first state at every save: "the second
save writes the first's values". Both runs then end on the same stale dict, and comparing
them finds nothing. What shows it is the uninterrupted run alone: an entry of the state that
equals, by digest, the trainer's own entry of the same name at some step t (the state's
`model.0.weight` and the observed `trainer.model.0.weight`: the state's key names the
trainer's attribute), and still holds that digest at the first later step at which the
trainer's entry has moved. Such an entry is stale; the first one (the state's order) is
reported, with the step it copied and the step from which it lags. Names and digests must
both match, so two entries that are merely equal (two zero tensors) are not confused, a
copy kept on purpose under a name of its own (`best.0.weight`, the best weights so far) is
not taken for the model, and a state that leaves an entry out is not stale (the
missing-entry checks name it). A state whose keys name no attribute is not watched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["stale_entry"]

Digests = dict[str, dict[str, str]]  # one step of a trail: {"state": ..., "observed": ...}


def _twin(name: str, observed: Collection[str]) -> str | None:
    """The trainer's observed entry of the same name (NOTE [ A state that does not move ])."""
    return f"trainer.{name}" if f"trainer.{name}" in observed else None


def stale_entry(trail: Sequence[Digests]) -> tuple[str, str, int, int] | None:
    """(state entry, the trainer's entry it copies, the step it copied, the first step it
    lags) of the first stale entry in an uninterrupted run's digests, or None."""
    names = dict.fromkeys(n for step in trail for n in step["state"])  # first seen first
    observed = {n for step in trail for n in step["observed"]}  # AdamW's state comes later
    for name in names:
        twin = _twin(name, observed)
        if twin is None:
            continue
        for t, step in enumerate(trail):
            kept = step["state"].get(name)
            if step["observed"].get(twin) != kept:
                continue  # not a copy of the trainer's entry at t
            moved = next((u for u in range(t + 1, len(trail))
                          if trail[u]["observed"].get(twin) != kept), None)
            if moved is not None and trail[moved]["state"].get(name) == kept:
                return name, twin, t, moved
    return None
