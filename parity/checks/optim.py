"""Quick checks of the optim claims for `python -m parity report`, and the drivers that
parity/test_optim.py shares: one run of an optimizer or a schedule on both sides."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy, measure
from parity.report import Observation, check
from parity.tolerances import claim
from reference import optim as ref
from reference.nn import Parameter
from torch_impl import optim as topt

FUSED = torch.backends.cpu.get_cpu_capability() != "DEFAULT"  # NOTE [ FMA in torch's CPU kernels ]
SCHEDULERS = ("StepLR", "CosineAnnealingLR", "LinearLR")


def torch_sqrt(a: np.ndarray) -> np.ndarray:
    """torch's CPU square root on a NumPy array (NOTE [ torch's CPU sqrt is MKL's ])."""
    return torch.sqrt(torch.from_numpy(np.ascontiguousarray(a))).numpy()


def run_optimizers(name: str, hyper: dict[str, Any], dtype: type, shapes: list[tuple[int, ...]],
                   steps: int, seed: int, *, grad_scale: float = 1.0,
                   lr_changes: dict[int, float] | None = None, save_at: int | None = None,
                   cross: bool = False, two_groups: bool = False, sqrt: str = "torch",
                   ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Run reference.optim.<name> and torch.optim.<name> on the same parameters and gradients.

    At step `lr_changes` keys every group's lr is set to the value; at `save_at` both
    optimizers are rebuilt from their state_dicts (from the OTHER side's, converted, when
    `cross`). Returns (label, reference array, torch array) for every parameter and every
    state entry, after checking that both sides hold the same state entries.
    """
    rng = np.random.default_rng(seed)
    init = [np.asarray(rng.standard_normal(s)).astype(dtype) for s in shapes]
    ref_params = [Parameter(x.copy()) for x in init]
    torch_params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in init]
    options: dict[str, Any] = {"fma": FUSED}
    if name != "SGD" and sqrt == "torch":
        options["sqrt"] = torch_sqrt

    def groups(params: list) -> list:
        if two_groups and len(params) > 1:
            return [{"params": params[:1]}, {"params": params[1:], "lr": hyper["lr"] / 2}]
        return params

    def build() -> tuple[ref.Optimizer, torch.optim.Optimizer]:
        return (getattr(ref, name)(groups(ref_params), **hyper, **options),
                getattr(torch.optim, name)(groups(torch_params), **hyper))

    ref_opt, torch_opt = build()
    for step in range(steps):
        if lr_changes and step in lr_changes:
            for g in ref_opt.param_groups + torch_opt.param_groups:
                g["lr"] = lr_changes[step]
        if step == save_at:
            ref_sd, torch_sd = ref_opt.state_dict(), torch_opt.state_dict()
            ref_opt, torch_opt = build()
            if cross:
                ref_sd, torch_sd = (topt.optimizer_state_from_torch(torch_sd),
                                    topt.optimizer_state_to_torch(ref_sd, name))
            ref_opt.load_state_dict(ref_sd)
            torch_opt.load_state_dict(torch_sd)
        for i, (rp, tp) in enumerate(zip(ref_params, torch_params, strict=True)):
            # A parameter without a gradient is skipped by both (never the first parameter's
            # first step, so that every run has some optimizer state to compare).
            if rng.random() < 0.1 and (i, step) != (0, 0):
                rp.grad, tp.grad = None, None
                continue
            g = np.asarray(rng.standard_normal(rp.data.shape) * grad_scale).astype(dtype)
            rp.grad, tp.grad = g.copy(), torch.from_numpy(g.copy())
        ref_opt.step()
        torch_opt.step()
    out = [(f"param {i}", rp.data, tp.detach().numpy())
           for i, (rp, tp) in enumerate(zip(ref_params, torch_params, strict=True))]
    ref_state = ref_opt.state_dict()["state"]
    torch_state = topt.optimizer_state_from_torch(torch_opt.state_dict())["state"]
    if {i: sorted(s) for i, s in ref_state.items()} != {i: sorted(s) for i, s in
                                                         torch_state.items()}:
        raise AssertionError(f"state entries differ: {ref_state.keys()} vs {torch_state.keys()}")
    out += [(f"state[{i}][{k!r}]", v, torch_state[i][k])
            for i, s in ref_state.items() for k, v in s.items()]
    return out


def run_schedules(kind: str, kw: dict[str, Any], base_lr: float, steps: int,
                  save_at: int | None = None, cross: bool = False) -> tuple[np.ndarray, ...]:
    """The lr after construction and after each of `steps` steps, reference and torch.

    At `save_at` both sides are rebuilt as torch documents for a resume (new optimizer,
    new scheduler, then both load_state_dict), from the other side's state when `cross`.
    """
    def build(side: Any, optim_module: Any, param: Any) -> tuple[Any, Any]:
        opt = optim_module.SGD([param], lr=base_lr)
        return opt, getattr(side, kind)(opt, **kw)

    ref_param = Parameter(np.zeros(1))
    torch_param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    r_opt, r_sched = build(ref, ref, ref_param)
    t_opt, t_sched = build(torch.optim.lr_scheduler, torch.optim, torch_param)
    ref_lrs, torch_lrs = [r_sched.get_last_lr()[0]], [t_sched.get_last_lr()[0]]
    for step in range(steps):
        if step == save_at:
            r_sd = (r_opt.state_dict(), r_sched.state_dict())
            t_sd = (t_opt.state_dict(), t_sched.state_dict())
            r_opt, r_sched = build(ref, ref, ref_param)
            t_opt, t_sched = build(torch.optim.lr_scheduler, torch.optim, torch_param)
            if cross:
                r_sd, t_sd = ((topt.optimizer_state_from_torch(t_sd[0]),
                               topt.scheduler_state_from_torch(t_sd[1])),
                              (topt.optimizer_state_to_torch(r_sd[0], "SGD"),
                               topt.scheduler_state_to_torch(r_sd[1])))
            r_opt.load_state_dict(r_sd[0])
            r_sched.load_state_dict(r_sd[1])
            t_opt.load_state_dict(t_sd[0])
            t_sched.load_state_dict(t_sd[1])
        r_opt.step()
        t_opt.step()
        r_sched.step()
        t_sched.step()
        ref_lrs.append(r_sched.get_last_lr()[0])
        torch_lrs.append(t_sched.get_last_lr()[0])
    return np.array(ref_lrs, dtype=np.float64), np.array(torch_lrs, dtype=np.float64)


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
    back = topt.optimizer_state_to_torch(topt.optimizer_state_from_torch(sd), "Adam")
    pairs += [(k, sd["state"][0][k], back["state"][0][k]) for k in sd["state"][0]]
    if back["param_groups"] != sd["param_groups"]:
        raise AssertionError("param_groups changed in the round trip")
    return _worst("optim.state_roundtrip_bits", pairs)
