"""Quick checks of the optim claims for `python -m parity report` (drivers:
parity/drivers/optim.py)."""

from __future__ import annotations

import numpy as np
import torch

from parity.compare import as_numpy, measure
from parity.drivers.optim import FUSED, run_optimizers, run_schedules, torch_sqrt
from parity.report import Observation, check
from parity.tolerances import claim
from reference import fma as ref
from torch_impl import optim as topt


def _worst(claim_id: str, pairs: list[tuple[str, np.ndarray, np.ndarray]]) -> Observation:
    c = claim(claim_id)
    worst = max(measure(c, a, b) for _, a, b in pairs)
    return Observation(worst, sum(as_numpy(a).size for _, a, _ in pairs))


@check("optim.fma_bits")
def _() -> Observation:
    rng = np.random.default_rng(0)
    pairs = []
    for dtype in (np.float32, np.float64):
        for n in (*range(1, 70), 4099):
            p, g, e = (np.asarray(rng.standard_normal(n)).astype(dtype) for _ in range(3))
            tp = torch.from_numpy(p.copy()).add_(torch.from_numpy(g), alpha=-0.0123)
            pairs.append(("add", ref.fma(g, dtype(-0.0123), p, FUSED), tp.numpy()))
            tv = torch.from_numpy(p.copy()).addcmul_(torch.from_numpy(g), torch.from_numpy(e),
                                                     value=0.001)
            pairs.append(("addcmul", ref.fma(g * dtype(0.001), e, p, FUSED), tv.numpy()))
            for w in (0.1, 0.5, 0.7):
                te = torch.from_numpy(p.copy()).lerp_(torch.from_numpy(g), w)
                pairs.append(("lerp", ref.lerp(p, g, dtype(w), FUSED), te.numpy()))
    return _worst("optim.fma_bits", pairs)


@check("optim.sgd_bits")
def _() -> Observation:
    pairs = []
    for dtype in (np.float32, np.float64):
        hyper = {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3}
        pairs += run_optimizers("SGD", hyper, dtype, [(33,), (4, 5), ()], 30, 1,
                                lr_changes={10: 0.01}, save_at=20, cross=True)
        pairs += run_optimizers("SGD", {"lr": 0.1, "momentum": 0.5, "nesterov": True},
                                dtype, [(17,)], 10, 2, save_at=5)
    return _worst("optim.sgd_bits", pairs)


@check("optim.adam_bits")
def _() -> Observation:
    pairs = []
    for dtype in (np.float32, np.float64):
        pairs += run_optimizers("Adam", {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True},
                                dtype, [(33,), (4, 5), ()], 30, 3, lr_changes={10: 3e-3},
                                save_at=20, cross=True)
        pairs += run_optimizers("AdamW", {"lr": 1e-2, "betas": (0.5, 0.99)}, dtype,
                                [(65,)], 20, 4, save_at=7)
    return _worst("optim.adam_bits", pairs)


@check("optim.adam_moments_bits")
def _() -> Observation:
    pairs = []
    for dtype in (np.float32, np.float64):
        pairs += [x for x in run_optimizers("Adam", {"lr": 1e-2, "amsgrad": True}, dtype,
                                            [(33,), (4, 5)], 30, 5, sqrt="ieee")
                  if x[0].startswith("state")]
    return _worst("optim.adam_moments_bits", pairs)


@check("optim.torch_sqrt_f32_ulps")
def _() -> Observation:
    v = np.abs(np.random.default_rng(6).standard_normal(200_000)).astype(np.float32)
    t = torch_sqrt(v)
    rate = float(np.mean(t != np.sqrt(v)))
    return Observation(measure(claim("optim.torch_sqrt_f32_ulps"), t, np.sqrt(v)), v.size,
                       f"{rate:.1%} of elements differ from IEEE sqrt")


@check("optim.torch_sqrt_f64_ulps")
def _() -> Observation:
    v = np.abs(np.random.default_rng(7).standard_normal(200_000))
    t = torch_sqrt(v)
    rate = float(np.mean(t != np.sqrt(v)))
    return Observation(measure(claim("optim.torch_sqrt_f64_ulps"), t, np.sqrt(v)), v.size,
                       f"{rate:.1%} of elements differ from IEEE sqrt")


@check("optim.schedules_bits")
def _() -> Observation:
    pairs = []
    for kind, kw in (("StepLR", {"step_size": 3, "gamma": 0.7}),
                     ("CosineAnnealingLR", {"T_max": 7, "eta_min": 1e-4}),
                     ("LinearLR", {"start_factor": 0.1, "total_iters": 9})):
        for cross in (False, True):
            r, t = run_schedules(kind, kw, 0.3, 50, save_at=17, cross=cross)
            pairs.append((kind, r, t))
    return _worst("optim.schedules_bits", pairs)


@check("optim.state_roundtrip_bits")
def _() -> Observation:
    pairs = run_optimizers("Adam", {"lr": 1e-2, "amsgrad": True}, np.float32, [(9,), ()], 6, 8,
                           save_at=3, cross=True)
    params = [torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(0)))]
    opt = torch.optim.Adam(params, lr=1e-3)
    params[0].grad = torch.ones(5)
    opt.step()
    sd = opt.state_dict()
    back = topt.optimizer_state_to_torch(topt.optimizer_state_from_torch(sd, "Adam"), "Adam")
    pairs += [(k, sd["state"][0][k], back["state"][0][k]) for k in sd["state"][0]]
    if back["param_groups"] != sd["param_groups"]:
        raise AssertionError("param_groups changed in the round trip")
    return _worst("optim.state_roundtrip_bits", pairs)
