"""SGD, Adam and AdamW's hyperparameters at each edge of their declared ranges
(common/arg_ranges.py: torch.optim's own checks, torch/optim/sgd.py and adam.py) and one past
each: the reference and torch.optim are both built, or both refuse with the same error line
(torch's text: `Invalid learning rate: -5e-324`); built, they leave the same bits in every
parameter and state entry over two steps (claims optim.sgd_bits, optim.adam_bits). SGD
takes a NaN lr, momentum or weight decay (torch writes `lr < 0.0`), Adam refuses one
(`not 0.0 <= lr`); neither has an upper edge but Adam's betas. The strategy that draws
hyperparameters over the declared ranges reaches each edge, and on any draw both trees agree.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from common import arg_ranges as ar
from parity.drivers.edges import judge, outcome
from parity.drivers.optim import FUSED, run_optimizers, torch_sqrt
from parity.strategies.budget import examples
from parity.strategies.edges import edges
from parity.strategies.optim import optim_declared_hyper
from reference import optim as ropt
from reference.module import Parameter
from torch_impl import optim as topt

CLAIM = {"SGD": "optim.sgd_bits", "Adam": "optim.adam_bits", "AdamW": "optim.adam_bits"}
BASE: dict[str, dict[str, Any]] = {  # every term of the step in play
    "SGD": {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01},
    "Adam": {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
}
BASE["AdamW"] = BASE["Adam"]
RANGES = {
    "SGD": {"lr": ar.SGD_LRS, "momentum": ar.SGD_MOMENTA, "weight_decay": ar.SGD_WEIGHT_DECAYS},
    "Adam": {"lr": ar.ADAM_LRS, "eps": ar.ADAM_EPSILONS, "betas[0]": ar.ADAM_BETAS,
             "betas[1]": ar.ADAM_BETAS, "weight_decay": ar.ADAM_WEIGHT_DECAYS},
}
RANGES["AdamW"] = RANGES["Adam"]
SHAPES = [(3,), (17,)]  # a vector tail and a vector body of torch's CPU kernels


def _with(name: str, arg: str, value: Any) -> dict[str, Any]:
    hyper = dict(BASE[name])
    if arg.startswith("betas["):
        betas = list(hyper["betas"])
        betas[int(arg[6])] = value
        hyper["betas"] = tuple(betas)
    else:
        hyper[arg] = value
    return hyper


def _cases() -> dict[str, tuple[str, dict[str, Any], bool]]:
    c: dict[str, tuple[str, dict[str, Any], bool]] = {}
    for name, ranges in RANGES.items():
        for arg, declared in ranges.items():
            for label, v, inside in edges(declared):
                c[f"{name} {arg} {label}"] = name, _with(name, arg, v), inside
    # torch's checks across arguments: nesterov needs momentum and no dampening; an Adam's
    # betas are two floats (torch: or two tensors)
    c["SGD nesterov without momentum"] = "SGD", {"lr": 0.1, "nesterov": True}, False
    c["SGD nesterov with dampening"] = "SGD", {
        "lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}, False
    c["SGD nesterov"] = "SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, True
    for name in ("Adam", "AdamW"):
        c[f"{name} betas with an int"] = name, _with(name, "betas[0]", 0), False
        c[f"{name} betas with a float32"] = name, _with(name, "betas[1]", np.float32(0.5)), False
    return c


CASES = _cases()


def _built(name: str, hyper: dict[str, Any]) -> tuple[Any, Any]:
    """The outcome of building each tree's optimizer on one parameter."""
    ref = outcome(lambda: getattr(ropt, name)([Parameter(np.zeros(2, np.float32))], **hyper))
    tor = outcome(lambda: getattr(topt, name)([torch.nn.Parameter(torch.zeros(2))], **hyper))
    return ref, tor


def _steps(tree: str, name: str, hyper: dict[str, Any]) -> list[np.ndarray]:
    """Each tree on its own: two steps from the same parameters and gradients (SHAPES,
    float32), the reference fused as this CPU's kernels and with torch's square root
    (parity/drivers/optim.py); the parameters after them."""
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(2)]
    if tree == "reference":
        params = [Parameter(x.copy()) for x in init]
        options: dict[str, Any] = {"fma": FUSED} | ({} if name == "SGD" else
                                                    {"sqrt": torch_sqrt})
        opt = getattr(ropt, name)(params, **hyper, **options)
        for g in grads:
            for p, gi in zip(params, g, strict=True):
                p.grad = gi.copy()
            opt.step()
        return [p.data for p in params]
    tparams = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in init]
    topt_ = getattr(topt, name)(tparams, **hyper)
    for g in grads:
        for p, gi in zip(tparams, g, strict=True):
            p.grad = torch.from_numpy(gi.copy())
        topt_.step()
    return [p.detach().numpy() for p in tparams]


def _judge_steps(name: str, hyper: dict[str, Any], context: str) -> None:
    """Two steps of each tree: the same parameters' bits, or the same error line (torch's
    checked conversion of a scalar, raised at the step)."""
    ref = outcome(lambda: _steps("reference", name, hyper))
    tor = outcome(lambda: _steps("torch", name, hyper))
    judge(CLAIM[name], ref, tor, f"{context} steps")
    if ref.error is None and tor.error is None:  # every state entry too, where they step
        for label, r, t in run_optimizers(name, hyper, np.float32, SHAPES, 2, seed=3):
            judge(CLAIM[name], outcome(lambda r=r: r), outcome(lambda t=t: t),
                  f"{context} {label}")


@pytest.mark.parametrize("case", list(CASES))
def test_each_hyperparameter_at_each_declared_edge_is_the_same_in_both_trees(case: str) -> None:
    """lr, momentum, eps, weight decay at 0, just below 0, inf and NaN; each beta at 0, just
    below 0, just below 1 and 1: both built and stepping alike, or the same error line."""
    name, hyper, inside = CASES[case]
    ref, tor = _built(name, hyper)
    assert inside == (ref.error is None), f"{case}: inside {inside}, reference {ref.error}"
    if ref.error is not None or tor.error is not None:
        judge(CLAIM[name], ref, tor, case)
        return
    _judge_steps(name, hyper, case)


@pytest.mark.parametrize("name", list(RANGES))
@settings(examples(15))
@given(data=st.data())
def test_any_declared_hyperparameters_build_and_step_alike(name: str, data: st.DataObject
                                                          ) -> None:
    """Any hyperparameters of the declared ranges: both trees build, and step the same bits
    or raise the same line at the step."""
    hyper = data.draw(optim_declared_hyper(name))
    ref, tor = _built(name, hyper)
    assert ref.error is None and tor.error is None, (hyper, ref.error, tor.error)
    _judge_steps(name, hyper, f"{name} {hyper}")


def test_the_hyperparameter_strategy_reaches_every_declared_edge() -> None:
    """optim_declared_hyper draws each hyperparameter at each edge its range takes."""
    for name in ("SGD", "Adam"):
        for arg, declared in RANGES[name].items():
            for _, v, inside in edges(declared):
                if not inside or math.isnan(v):
                    continue
                find(optim_declared_hyper(name),
                     lambda h, a=arg, v=v: _with_value(h, a) == v,
                     settings=settings(max_examples=2000, database=None, derandomize=True,
                                       phases=[Phase.generate],
                                       suppress_health_check=list(HealthCheck)))


def _with_value(hyper: dict[str, Any], arg: str) -> Any:
    return hyper["betas"][int(arg[6])] if arg.startswith("betas[") else hyper[arg]

