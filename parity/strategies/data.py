"""Hypothesis strategies for data (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from common.arg_ranges import SEEDS
from parity.strategies.edges import declared_values

# A sampler run: `epochs` epochs of batches, interrupted (state saved, a fresh sampler
# loaded from it) after `interrupt` batches. `kind` says where the cut fell, for events.
DATA_INTERRUPTIONS = ("start", "mid_epoch", "epoch_boundary", "end")


def data_batches_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches one epoch yields: floor(n / B) with drop_last, ceil(n / B) without."""
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


@st.composite
def data_sampler_runs(draw: st.DrawFn, max_samples: int = 64) -> dict:
    """{seed, num_samples, batch_size, drop_last, epochs, interrupt, kind}: a resume case.

    The cut is chosen as one of DATA_INTERRUPTIONS (start, mid-epoch, exactly at an epoch
    boundary, after the last batch); `kind` is recomputed from the numbers, so a test can
    hypothesis.event() the edge it really reached.
    """
    want = draw(st.sampled_from(DATA_INTERRUPTIONS))
    seed = draw(declared_values(SEEDS))  # the whole declared range, its edges often
    if want == "mid_epoch":  # n // batch_size >= 2: an epoch has an inside
        n = draw(st.integers(2, max_samples))
        batch_size = draw(st.integers(1, n // 2))
    else:
        n = draw(st.integers(1, max_samples))
        batch_size = draw(st.integers(1, n + 2))
    drop_last = draw(st.booleans())
    epochs = draw(st.integers(2, 3))  # >= 2: an epoch boundary before the end exists
    per_epoch = data_batches_per_epoch(n, batch_size, drop_last)
    total = epochs * per_epoch
    if want == "start" or total == 0:
        interrupt = 0
    elif want == "end":
        interrupt = total
    elif want == "epoch_boundary" or per_epoch < 2:
        interrupt = per_epoch * draw(st.integers(1, epochs - 1))
    else:
        interrupt = per_epoch * draw(st.integers(0, epochs - 1)) + draw(
            st.integers(1, per_epoch - 1))
    if interrupt == 0:
        kind = "start"
    elif interrupt == total:
        kind = "end"
    elif interrupt % per_epoch == 0:
        kind = "epoch_boundary"
    else:
        kind = "mid_epoch"
    return {"seed": seed, "num_samples": n, "batch_size": batch_size, "drop_last": drop_last,
            "epochs": epochs, "interrupt": interrupt, "kind": kind}


@st.composite
def data_length_cases(draw: st.DrawFn, max_samples: int = 64) -> dict:
    """{seed, num_samples, batch_size, drop_last, consumed, via}: a sampler moved past
    `consumed` samples of epoch 0 (0..n; n is the epoch's end) by drawing them or by
    load_state_dict. `where` names the edge reached, for events."""
    n = draw(st.integers(1, max_samples))
    consumed = draw(st.one_of(st.sampled_from((0, n)), st.integers(0, n)))
    case = {"seed": draw(declared_values(SEEDS)), "num_samples": n,
            "batch_size": draw(st.integers(1, n + 2)), "drop_last": draw(st.booleans()),
            "consumed": consumed, "via": draw(st.sampled_from(("iterate", "load_state_dict")))}
    left = n - consumed if consumed < n else n
    case["where"] = ("start" if consumed == 0 else "epoch end" if consumed == n else
                     "short last batch" if left % case["batch_size"] else "whole batches left")
    return case
