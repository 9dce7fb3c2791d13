"""Running the optimizers and LR schedules of both trees on the same parameters and gradients.

The optimizers run on the CPU only: their claims are about torch's CPU kernels (NOTE [ FMA in
torch's CPU kernels ] in reference/fma.py); the schedules are plain Python on any device.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from reference import lr_scheduler as ref_sched
from reference import optim as ref
from reference.module import Parameter
from torch_impl import optim as topt
from torch_impl import state_mapping as tstate

# NOTE [ FMA in torch's CPU kernels ]: the kernels fuse unless the capability is DEFAULT.
FUSED = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


SCHEDULERS = ("StepLR", "CosineAnnealingLR", "LinearLR")


def torch_sqrt(a: np.ndarray) -> np.ndarray:
    """torch's CPU square root on a NumPy array (NOTE [ torch's CPU sqrt is MKL's ])."""
    # reshaped: ascontiguousarray makes a 0-d array or a NumPy scalar 1-d
    return torch.sqrt(torch.from_numpy(np.ascontiguousarray(a))).numpy().reshape(np.shape(a))


def run_optimizers(name: str, hyper: dict[str, Any], dtype: type, shapes: list[tuple[int, ...]],
                   steps: int, seed: int, *, grad_scale: float = 1.0,
                   lr_changes: dict[int, float] | None = None, save_at: int | None = None,
                   cross: bool = False, two_groups: bool = False, sqrt: str = "torch",
                   ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Run reference.optim.<name> and its twin torch_impl.optim.<name> (torch.optim's own) on
    the same parameters and gradients.

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

    def build() -> tuple[ref.Optimizer, topt.Optimizer]:
        return (getattr(ref, name)(groups(ref_params), **hyper, **options),
                getattr(topt, name)(groups(torch_params), **hyper))

    ref_opt, torch_opt = build()
    for step in range(steps):
        if lr_changes and step in lr_changes:
            for g in ref_opt.param_groups + torch_opt.param_groups:
                g["lr"] = lr_changes[step]
        if step == save_at:
            ref_sd, torch_sd = ref_opt.state_dict(), torch_opt.state_dict()
            ref_opt, torch_opt = build()
            if cross:
                ref_sd, torch_sd = (tstate.optimizer_state_from_torch(torch_sd, name),
                                    tstate.optimizer_state_to_torch(ref_sd, name))
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
    torch_state = tstate.optimizer_state_from_torch(torch_opt.state_dict(), name)["state"]
    if {i: sorted(s) for i, s in ref_state.items()} != {i: sorted(s) for i, s in
                                                         torch_state.items()}:
        raise AssertionError(f"state entries differ: {ref_state.keys()} vs {torch_state.keys()}")
    out += [(f"state[{i}][{k!r}]", v, torch_state[i][k])
            for i, s in ref_state.items() for k, v in s.items()]
    return out


def run_schedules(kind: str, kw: dict[str, Any], base_lr: float, steps: int,
                  save_at: int | None = None, cross: bool = False, device: str = "cpu"
                  ) -> tuple[np.ndarray, ...]:
    """The lr after construction and after each of `steps` steps, reference and torch.

    At `save_at` both sides are rebuilt as torch documents for a resume (new optimizer,
    new scheduler, then both load_state_dict), from the other side's state when `cross`.
    The torch optimizer's parameter lives on `device` (the schedule itself is Python).
    """
    def build(side: Any, optim_module: Any, param: Any) -> tuple[Any, Any]:
        opt = optim_module.SGD([param], lr=base_lr)
        return opt, getattr(side, kind)(opt, **kw)

    ref_param = Parameter(np.zeros(1))
    torch_param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64, device=device))
    r_opt, r_sched = build(ref_sched, ref, ref_param)
    t_opt, t_sched = build(torch.optim.lr_scheduler, topt, torch_param)
    ref_lrs, torch_lrs = [r_sched.get_last_lr()[0]], [t_sched.get_last_lr()[0]]
    for step in range(steps):
        if step == save_at:
            r_sd = (r_opt.state_dict(), r_sched.state_dict())
            t_sd = (t_opt.state_dict(), t_sched.state_dict())
            r_opt, r_sched = build(ref_sched, ref, ref_param)
            t_opt, t_sched = build(torch.optim.lr_scheduler, topt, torch_param)
            if cross:
                r_sd, t_sd = ((tstate.optimizer_state_from_torch(t_sd[0], "SGD"),
                               tstate.scheduler_state_from_torch(t_sd[1])),
                              (tstate.optimizer_state_to_torch(r_sd[0], "SGD"),
                               tstate.scheduler_state_to_torch(r_sd[1])))
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


def bf16_to_torch(a: np.ndarray) -> torch.Tensor:
    """An ml_dtypes.bfloat16 array as a torch.bfloat16 tensor, the same codes."""
    codes = np.array(a, order="C").view(np.int16).reshape(np.shape(a))
    return torch.from_numpy(codes).view(torch.bfloat16)


def bf16_from_torch(t: torch.Tensor) -> np.ndarray:
    """A torch.bfloat16 tensor as an ml_dtypes.bfloat16 array, the same codes."""
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
