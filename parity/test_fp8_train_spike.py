"""The loss-scaling lesson carried to fp8 (parity/drivers/fp8_train_spike.py): a seeded
activation spike saturates delayed scaling's stale scale and not current scaling's; the
format counts are the same in both trees (fp8_train.spike)."""

from __future__ import annotations

import pytest

from parity.compare import assert_claim
from parity.drivers import fp8_train_spike as drv


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    return {name: drv.run(name) for name in drv.RUNS}


def test_spike_counts_are_the_same_integers_in_both_trees(runs: dict) -> None:
    """Every step's e4m3 format counts of x * s, every recipe of the lesson."""
    for name, r in runs.items():
        assert_claim("fp8_train.spike", actual=r["torch"], expected=r["reference"], context=name)


def test_the_stale_delayed_scale_saturates_at_the_spike_and_current_scaling_does_not(
        runs: dict) -> None:
    """Delayed (any history) saturates most of the spiked tensor; the output's error jumps
    from the e4m3 level to order 1. Current scaling and the margin saturate nothing there."""
    at = drv.SPIKE_STEP
    size = drv.N * drv.D_IN
    for name in ("delayed", "delayed_history_1"):
        assert runs[name]["reference"][at, drv.OVER_MAX] > size // 2, name
        assert runs[name]["error"][at] > 0.5 > 0.1 > runs[name]["error"][at - 1]
    for name in ("current", "delayed_margin"):
        assert runs[name]["reference"][:, drv.OVER_MAX].sum() == 0, name
        assert runs[name]["error"][at] < 0.1, name


def test_the_margin_pays_for_its_headroom_in_underflow_while_the_spike_is_remembered(
        runs: dict) -> None:
    """With the spike in the history, margin 6 makes ordinary inputs underflow: more to_zero
    after the spike than before, and than delayed scaling without the margin."""
    at = drv.SPIKE_STEP
    margin = runs["delayed_margin"]["reference"][:, drv.TO_ZERO]
    plain = runs["delayed"]["reference"][:, drv.TO_ZERO]
    assert margin[at + 1:].sum() > 10 * max(1, margin[:at].sum())
    assert margin[at + 1:].sum() > 10 * max(1, plain[at + 1:].sum())
