"""The audit's rows for this project's N-rank checkpoints (`python -m parity train
--world-size N`): every rank's state against the table the N-rank resume reads, instead
of audit_recognize.py's structural guesses (a rank's state is one flat dict of
"model/<name>"-style keys, which no foreign layout uses).

The table (torch_impl/sharded_ckpt.py's, plus "skipped" from both trees' ddp_train.py),
each entry read by the resume (the torch tree's dcp.load into a template of these keys
fails on a missing one; the reference's indexes each):

    row                 keys of rank r's state
    model               model/<name>            (names and shapes: reference/train_models.py's
                                                 build of the step's config.json)
    optimizer           optim/momentum/<i>      SGD's momentum buffer of parameter i
    scaler              scaler/scale, scaler/growth_tracker
    torch CPU RNG       rng/rank<r>             the torch tree's per-rank stream
    numpy RNG           rng/rank<r>             the reference's (a PCG64 state)
    data position       data/epoch, data/position   (*)
    epoch               data/epoch                  (*)
    global step         step, skipped               (*) (skipped: overflow-skipped steps)

(*) global, the same in every rank's state: the reference's resume reads them from rank
0's file alone, so only rank 0's are required there (a rank file audited alone: its own).
The reference reads the scaler's entries only in fp16 (its scaler is disabled otherwise);
the torch tree's template holds every entry in every precision.

The N-rank run trains SGD at a constant lr on the CPU: its optimizer keeps no step count,
it has no scheduler, and neither CUDA, numpy (torch tree), torch (reference) nor Python's
random is drawn from; those rows say "not needed" with the condition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from parity.lab.audit_recognize import (
    DISABLED,
    INCOMPLETE,
    MISSING,
    NOT_NEEDED,
    PRESENT,
    REQUIRED,
    Audit,
    Row,
    is_tensor,
)

SCALER = ("scaler/scale", "scaler/growth_tracker")
DATA = ("data/epoch", "data/position")
STEP = ("step", "skipped")
SHOWN = 3  # missing keys named in a row's detail before "..."


def expected_shapes(config: Mapping[str, Any] | None) -> dict[str, tuple[int, ...]] | None:
    """model/<name> and optim/momentum/<i> -> shape, for the run `config` (a TrainConfig's
    dict) describes: its model built by the reference; None when it describes none."""
    from common.train_config import TrainConfig
    from reference.train_models import build

    if config is None:
        return None
    try:
        c = TrainConfig(**config)
        model = build(c, np.random.default_rng(c.seed)).model
    except (TypeError, ValueError):
        return None
    shapes = {f"model/{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    shapes.update({f"optim/momentum/{i}": tuple(p.data.shape)
                   for i, p in enumerate(model.parameters())})
    return shapes


def is_rank_state(state: Any) -> int | None:
    """r when `state` is rank r's state of an N-rank checkpoint (a flat dict with model/
    entries and one rng/rank<r>), else None."""
    if not isinstance(state, Mapping) or not any(str(k).startswith("model/") for k in state):
        return None
    ranks = [k[len("rng/rank"):] for k in state if str(k).startswith("rng/rank")]
    return int(ranks[0]) if len(ranks) == 1 and ranks[0].isdigit() else None


def _scalar(v: Any) -> Any:
    if is_tensor(v) and math.prod(v.shape) == 1:
        return v.item()
    return v


def rows(audit: Audit, states: Mapping[int, Mapping[str, Any]], tree: str,
         config: Mapping[str, Any] | None, world_size: int | None) -> None:
    """Append the table's rows for the ranks' `states` (rank -> its state; a value None where
    only the key's name is known, as in a DCP .metadata) of the `tree` ("reference" or
    "torch") that wrote them. `world_size`: the ranks of the run (None: not known)."""
    shapes = expected_shapes(config)
    found = sorted({k for s in states.values() for k in s})

    def prefixed(prefix: str) -> list[str]:
        if shapes is not None:
            return [k for k in shapes if k.startswith(prefix)]
        return [k for k in found if k.startswith(prefix)]

    def add(item: str, names: Callable[[int], list[str]], where: str,
            detail: Callable[[], str], need: str = REQUIRED) -> None:
        lacks = {r: [n for n in names(r) if n not in s] for r, s in states.items()}
        wrong = {r: [n for n in names(r) if n in s and _wrong_shape(n, s[n], shapes)]
                 for r, s in states.items()}
        if not any(lacks.values()) and not any(wrong.values()) and any(
                names(r) for r in states):
            status, text = PRESENT, detail()
        elif all(len(lacks[r]) == len(names(r)) for r in states):
            status, text = MISSING, ""
        else:
            status, text = INCOMPLETE, "; ".join(
                f"rank {r} {what} {_few(ns)}" for r in sorted(states)
                for what, ns in (("lacks", lacks[r]), ("has the wrong shape of", wrong[r]))
                if ns)
        audit.rows.append(Row(item, status, where if status != MISSING else "", text, need))

    def not_needed(item: str, need: str, detail: str) -> None:
        audit.rows.append(Row(item, NOT_NEEDED, "", detail, need))

    first = states[min(states)] if states else {}
    reader = min(states) if states else 0  # the rank whose global entries the resume reads

    def global_(keys: tuple[str, ...]) -> Callable[[int], list[str]]:
        return lambda r: list(keys) if tree == "torch" or r == reader else []

    model = prefixed("model/")
    add("model", lambda r: model, "model/*", lambda: _model_detail(model, shapes, first))
    momenta = prefixed("optim/momentum/")
    add("optimizer", lambda r: momenta, "optim/momentum/*",
        lambda: f"SGD's momentum buffer of {len(momenta)} parameter(s)")
    not_needed("optimizer step counts", "if the optimizer keeps one",
               "SGD with momentum keeps no step count")
    not_needed("scheduler", "if the lr changes", "the N-rank run trains at a constant lr")
    fp16 = config is None or config.get("precision") == "fp16"
    add("scaler", lambda r: list(SCALER), ", ".join(SCALER), lambda: _pairs(first, SCALER),
        REQUIRED if fp16 or tree == "torch" else "if trained in fp16")
    if not fp16 and audit.rows[-1].status == PRESENT:
        old = audit.rows.pop()
        audit.rows.append(Row(old.item, DISABLED, old.where, f"{old.detail} (saved; unused "
                              f"in {config.get('precision') if config else '?'})", old.need))
    streams = "each rank's own stream" if len(states) > 1 else (
        f"rank {min(states)}'s stream only" + (
            f"; the other {world_size - 1} ranks' are in their own files"
            if world_size and world_size > 1 else "") if states else "")

    def rng(r: int) -> list[str]:
        return [f"rng/rank{r}"]

    where = ", ".join(f"rng/rank{r}" for r in sorted(states))
    if tree == "torch":
        add("torch CPU RNG", rng, where, lambda: streams)
    else:
        not_needed("torch CPU RNG", "if the run draws from torch",
                   "the reference draws from numpy")
    not_needed("CUDA RNG", "if trained on CUDA", "the N-rank run trains on the CPU (gloo)")
    if tree == "reference":
        add("numpy RNG", rng, where, lambda: f"{streams} (PCG64)")
    else:
        not_needed("numpy RNG", "if the run draws from numpy", "the torch tree draws from torch")
    not_needed("Python random", "if the run draws from random", "")
    add("data position", global_(DATA), ", ".join(DATA), lambda: _pairs(first, DATA))
    add("epoch", global_(("data/epoch",)), "data/epoch", lambda: _pairs(first, ("data/epoch",)))
    add("global step", global_(STEP), ", ".join(STEP), lambda: _pairs(first, STEP))


def _wrong_shape(name: str, value: Any, shapes: Mapping[str, tuple[int, ...]] | None) -> bool:
    return (shapes is not None and name in shapes and is_tensor(value)
            and tuple(value.shape) != shapes[name])


def _few(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > SHOWN
                                       else "")


def _model_detail(names: list[str], shapes: Mapping[str, tuple[int, ...]] | None,
                  first: Mapping[str, Any]) -> str:
    if not all(is_tensor(first.get(n)) for n in names):
        return f"{len(names)} tensors (names in .metadata; shapes not read)"
    values = sum(math.prod(first[n].shape) for n in names)
    return f"{len(names)} tensors, {values:,} values" + (
        " (the shapes the run's configuration builds)" if shapes is not None else "")


def _pairs(state: Mapping[str, Any], names: tuple[str, ...]) -> str:
    """'step = 4, skipped = 0' where the values are known, else the names."""
    if not all(n in state and state[n] is not None for n in names):
        return "names only (in .metadata)"
    return ", ".join(f"{n.rsplit('/', 1)[-1]} = {_scalar(state[n]):g}"
                     if isinstance(_scalar(state[n]), float)
                     else f"{n.rsplit('/', 1)[-1]} = {_scalar(state[n])}" for n in names)
