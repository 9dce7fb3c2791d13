"""Quick checks of the resume claims for `python -m parity report`, and the drivers that
parity/test_resume.py shares: a training state built on one side, mapped to the other,
loaded into that side's real objects, read back and mapped home again."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy, measure
from parity.report import Observation, check
from parity.tolerances import claim
from reference import nn as ref_nn
from reference import optim as ref_optim
from reference import resume as ref_resume
from torch_impl import nn as t_nn
from torch_impl import resume as t_resume

OPTIMIZERS: dict[str, dict[str, Any]] = {
    "SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4},
    "Adam": {"lr": 1e-3, "betas": (0.9, 0.99), "amsgrad": True},
    "AdamW": {"lr": 2e-3, "weight_decay": 0.05},
}
SCHEDULES: dict[str, dict[str, Any]] = {
    "StepLR": {"step_size": 2, "gamma": 0.5},
    "CosineAnnealingLR": {"T_max": 7},
    "LinearLR": {"total_iters": 4},
}


def flatten(state: Any, path: str = "") -> dict[str, np.ndarray]:
    """Every leaf of a state as a NumPy array, by path (tensors and arrays keep their bits).

    Python floats become float64, ints int64 (or their decimal text if wider), bools bool;
    str and None their text as uint8, so every leaf can be compared by a bits claim.
    """
    if isinstance(state, dict):
        out: dict[str, np.ndarray] = {}
        for k, v in state.items():
            out.update(flatten(v, f"{path}/{k}" if path else str(k)))
        return out
    if isinstance(state, list | tuple):
        out = {}
        for i, v in enumerate(state):
            out.update(flatten(v, f"{path}[{i}]"))
        return out
    if isinstance(state, torch.Tensor | np.ndarray | np.generic):
        return {path: np.array(as_numpy(state), copy=True)}
    if isinstance(state, bool):
        return {path: np.array(state)}
    if isinstance(state, float):
        return {path: np.array(state, dtype=np.float64)}
    if isinstance(state, int) and -(2**63) <= state < 2**63:
        return {path: np.array(state, dtype=np.int64)}
    return {path: np.frombuffer(repr(state).encode(), dtype=np.uint8)}


def reference_state(optimizer: str, schedule: str, steps: int, seed: int,
                    sizes: tuple[int, ...] = (8, 16, 3)) -> dict[str, Any]:
    """A reference training state after `steps` optimizer steps on random gradients."""
    rng = np.random.default_rng(seed)
    model = ref_nn.make_mlp(sizes, rng=rng)
    opt = getattr(ref_optim, optimizer)(model.parameters(), **OPTIMIZERS[optimizer])
    sched = getattr(ref_optim, schedule)(opt, **SCHEDULES[schedule])
    for _ in range(steps):
        for p in model.parameters():
            p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
        opt.step()
        sched.step()
    return {"config": {"sizes": list(sizes), "optimizer": optimizer, "schedule": schedule},
            "step": steps, "epoch": steps // 4, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "scaler": {"scale": float(2.0 ** rng.integers(0, 24)),
                       "growth_tracker": int(rng.integers(0, 2000))},
            "data": {"seed": seed, "num_samples": 64, "epoch": steps // 4,
                     "position": int(rng.integers(0, 64))},
            "rng": {"init": rng.bit_generator.state}}


def torch_objects(state: dict[str, Any]) -> tuple[torch.nn.Module, Any, Any]:
    """torch model, optimizer and scheduler shaped by a state's config (fresh values)."""
    cfg = state["config"]
    model = t_nn.make_mlp(cfg["sizes"], generator=torch.Generator().manual_seed(0))
    opt = getattr(torch.optim, cfg["optimizer"])(model.parameters(),
                                                 **OPTIMIZERS[cfg["optimizer"]])
    sched = getattr(torch.optim.lr_scheduler, cfg["schedule"])(opt, **SCHEDULES[cfg["schedule"]])
    return model, opt, sched


def reference_objects(state: dict[str, Any]) -> tuple[ref_nn.Module, Any, Any]:
    """reference model, optimizer and scheduler shaped by a state's config (fresh values)."""
    cfg = state["config"]
    model = ref_nn.make_mlp(cfg["sizes"], rng=np.random.default_rng(0))
    opt = getattr(ref_optim, cfg["optimizer"])(model.parameters(), **OPTIMIZERS[cfg["optimizer"]])
    sched = getattr(ref_optim, cfg["schedule"])(opt, **SCHEDULES[cfg["schedule"]])
    return model, opt, sched


def through_torch(ref_state: dict[str, Any], tmp: Any) -> dict[str, Any]:
    """reference state -> torch mapping -> torch checkpoint file -> torch objects -> back."""
    path = tmp / "torch.ckpt"
    t_resume.save_checkpoint(path, t_resume.state_from_reference(ref_state))
    loaded = t_resume.load_checkpoint(path)
    model, opt, sched = torch_objects(loaded)
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optimizer"])
    sched.load_state_dict(loaded["scheduler"])
    back = {**loaded, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict()}
    return t_resume.state_to_reference(back)


def through_reference(ref_state: dict[str, Any], tmp: Any) -> dict[str, Any]:
    """the same state through a reference checkpoint file and reference objects."""
    path = tmp / "reference.ckpt"
    ref_resume.save_checkpoint(path, ref_state)
    loaded = ref_resume.load_checkpoint(path)
    model, opt, sched = reference_objects(loaded)
    model.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optimizer"])
    sched.load_state_dict(loaded["scheduler"])
    return {**loaded, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict()}


def mapped(state: dict[str, Any]) -> dict[str, Any]:
    """The mapped part of a state (everything but the random streams)."""
    return {k: state[k] for k in t_resume.MAPPED_KEYS}


def compare_states(claim_id: str, actual: dict[str, Any], expected: dict[str, Any]
                   ) -> tuple[float, int]:
    """(worst mismatch count over all leaves, number of values compared); keys must agree."""
    a, b = flatten(mapped(actual)), flatten(mapped(expected))
    if sorted(a) != sorted(b):
        missing = sorted(set(b) ^ set(a))
        raise AssertionError(f"{claim_id}: the states hold different entries: {missing[:5]}")
    worst, n = 0.0, 0
    for key in b:
        if a[key].shape != b[key].shape or a[key].dtype != b[key].dtype:
            raise AssertionError(f"{claim_id}: {key} is {a[key].dtype} {a[key].shape} vs "
                                 f"{b[key].dtype} {b[key].shape}")
        worst = max(worst, measure(claim(claim_id), a[key], b[key]))
        n += b[key].size
    return worst, n


@check("resume.cross_impl_state")
def _() -> Observation:
    import tempfile
    from pathlib import Path

    worst, n = 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for optimizer, schedule in zip(OPTIMIZERS, SCHEDULES, strict=True):
            state = reference_state(optimizer, schedule, steps=5, seed=1)
            there_and_back = through_torch(through_reference(state, Path(tmp)), Path(tmp))
            w, k = compare_states("resume.cross_impl_state", there_and_back, state)
            worst, n = max(worst, w), n + k
    return Observation(worst, n, "SGD/StepLR, Adam(amsgrad)/Cosine, AdamW/Linear, 5 steps")
