"""GradScaler's arguments at each edge of their declared ranges (common/arg_ranges.py:
GROWTH_FACTORS and BACKOFF_FACTORS, what torch.amp.GradScaler's constructor refuses;
init_scale and growth_interval, which torch does not check: any float, any int) and one
past each: the reference and torch's GradScaler are both built with the same error line
or neither is, and then hold the same scale, tracker, skips, gradients and parameters over
a finite, an overflowing and a finite step (claim loss_scaling.scaler). The strategy that
draws the factors reads the same ranges."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, settings

from common.arg_ranges import BACKOFF_FACTORS, GROWTH_FACTORS
from parity.drivers.edges import judge, outcome
from parity.drivers.loss_scaling import SCALER_SHAPES, ScalerPair
from parity.strategies.edges import edges
from parity.strategies.loss_scaling import scaler_factors
from reference import loss_scaling as rls
from torch_impl import loss_scaling as tls

TINY = float.fromhex("0x1p-149")  # float32's smallest subnormal


def _cases() -> dict[str, tuple[dict[str, Any], bool]]:
    c: dict[str, tuple[dict[str, Any], bool]] = {}
    for label, v, inside in [*edges(GROWTH_FACTORS), ("2^200", 2.0**200, True)]:
        c[f"growth_factor {label}"] = {"growth_factor": v}, inside
    for label, v, inside in [*edges(BACKOFF_FACTORS), ("0", 0.0, True), ("-0.5", -0.5, True)]:
        c[f"backoff_factor {label}"] = {"backoff_factor": v}, inside
    for label, v in (("0", 0.0), ("-1", -1.0), ("inf", math.inf), ("NaN", math.nan),
                     ("past float32's max", 1e39), ("half the smallest subnormal", TINY / 2)):
        c[f"init_scale {label}"] = {"init_scale": v}, True
    for v in (0, 1, -1, 2**31 - 1):
        c[f"growth_interval {v}"] = {"growth_interval": v}, True
    return c


CASES = _cases()


def _stream(rng: np.random.Generator, plant: bool) -> list[np.ndarray]:
    grads = [rng.standard_normal(s).astype(np.float32) for s in SCALER_SHAPES]
    if plant:
        grads[1][0, 2] = np.inf
    return grads


@pytest.mark.parametrize("case", list(CASES))
def test_each_scaler_argument_at_each_declared_edge_is_the_same_in_both_trees(
        case: str, device: str) -> None:
    """Built with the same error line, or built alike and stepping alike."""
    hyper, inside = CASES[case]
    ref = outcome(lambda: rls.GradScaler(**hyper))
    tor = outcome(lambda: tls.GradScaler(torch.device(device).type, **hyper))
    assert inside or ref.error is not None, f"{case}: accepted outside its declared range"
    if ref.error is None and tor.error is None:  # the lazy scale: a loss scaled first
        ref = outcome(lambda: ref.value.scale(np.float32(3.0)))
        tor = outcome(lambda: tor.value.scale(torch.tensor(3.0, device=device)))
        assert_label = f"{case} scaled loss"
        judge("loss_scaling.scaler", ref, tor, assert_label)
    if ref.error is not None or tor.error is not None:
        judge("loss_scaling.scaler", ref, tor, case)
        return
    pair = ScalerPair({"init_scale": 2.0**10, **hyper}, SCALER_SHAPES, 0, device)
    rng = np.random.default_rng(1)
    for step, plant in enumerate((False, True, False, False)):
        pair.iterate(_stream(rng, plant), explicit_unscale=bool(step % 2))
        for label, a, b in pair.compare():
            assert_label = f"{case} step {step} {label}"
            judge("loss_scaling.scaler", outcome(lambda a=a: a), outcome(lambda b=b: b),
                  assert_label)


def test_the_factor_strategy_reaches_every_declared_edge() -> None:
    """scaler_factors draws each factor at its declared edges: growth just above 1 and inf,
    backoff just below 1."""
    up, down = math.nextafter(1.0, 2.0), math.nextafter(1.0, 0.0)
    for condition in (lambda f: f[0] == up, lambda f: f[0] == math.inf,
                      lambda f: f[1] == down):
        find(scaler_factors(), condition, settings=settings(
            max_examples=2000, database=None, derandomize=True, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck)))
