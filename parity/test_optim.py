"""Parity of reference.optim (and reference.fma, reference.lr_scheduler) with torch.optim:
the FMA emulation, the optimizers, the schedules and the state conversion.

Both sides start from the same parameters and receive the same gradients; every parameter
and every state entry is compared through a claim of parity/claims/optim.py. The drivers
(`run_optimizers`, `run_schedules`) are in parity/drivers/optim.py, shared with the report.
The optimizer claims are about torch's CPU kernels and skip on CUDA, saying why; the
schedules and the state conversion hold on any device.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.optim import FUSED, SCHEDULERS, run_optimizers, run_schedules, torch_sqrt
from parity.strategies import (
    OPTIM_TAIL_SIZES,
    examples,
    optim_adam_hyper,
    optim_grad_scales,
    optim_lrs,
    optim_sgd_hyper,
    optim_shapes,
)
from reference import fma as ref
from reference import lr_scheduler as ref_lr
from reference import optim as ref_optim
from reference.module import Parameter
from torch_impl import optim as topt
from torch_impl import state_mapping as tstate

DTYPES = st.sampled_from([np.float32, np.float64])

CPU_KERNELS = (
    "the claim is about torch's CPU kernels (NOTE [ FMA in torch's CPU kernels ], NOTE [ "
    "torch's CPU sqrt is MKL's ]); on CUDA torch.optim takes the foreach path by default, with "
    "other kernels")


def test_adamw_steps_match_torch_adamw_bitwise(device: str) -> None:
    """Five AdamW steps from the same parameters and gradients leave the reference's
    parameters and moments bit-identical to torch.optim.AdamW's (given torch's sqrt)."""
    skip_on_cuda(device)
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(np.float32)  # (4, 3)
    grads = rng.standard_normal((5, 4, 3)).astype(np.float32)  # (steps, 4, 3)
    ref_p = Parameter(init.copy())
    torch_p = torch.nn.Parameter(torch.from_numpy(init.copy()))
    ref_opt = ref_optim.AdamW([ref_p], lr=0.01, weight_decay=0.1, fma=FUSED, sqrt=torch_sqrt)
    torch_opt = topt.AdamW([torch_p], lr=0.01, weight_decay=0.1)
    for g in grads:
        ref_p.grad = g.copy()
        torch_p.grad = torch.from_numpy(g.copy())
        ref_opt.step()
        torch_opt.step()
    ref_v = ref_opt.state[ref_p]["exp_avg_sq"]  # (4, 3)
    torch_v = torch_opt.state[torch_p]["exp_avg_sq"]  # (4, 3)
    assert_claim("optim.adam_bits", actual=torch_v, expected=ref_v, context="exp_avg_sq")
    assert_claim("optim.adam_bits", actual=torch_p.detach(), expected=ref_p.data)


def skip_on_cuda(device: str, why: str = CPU_KERNELS) -> None:
    if device != "cpu":
        pytest.skip(f"CPU-specific claim: {why}")


def _assert_all(claim_id: str, pairs: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    assert pairs, "nothing was compared"
    for label, a, b in pairs:
        assert_claim(claim_id, actual=b, expected=a, context=label)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [*OPTIM_TAIL_SIZES, 0, 1000, 40_003])
def test_fma_and_lerp_match_torch_kernels_bitwise_at_every_size(device: str, dtype: type,
                                                                n: int) -> None:
    """fma/lerp equal torch's add(alpha=), addcmul_ and lerp_ in the vector body and the tail."""
    skip_on_cuda(device)
    rng = np.random.default_rng(n)
    shape = () if n == 0 else (n,)
    p, g, e = (np.asarray(rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape))
               .astype(dtype) for _ in range(3))
    lr = float(rng.uniform(0, 1))
    tp = torch.from_numpy(p.copy()).add_(torch.from_numpy(g), alpha=-lr)
    assert_claim("optim.fma_bits", actual=tp, expected=ref.fma(g, dtype(-lr), p, FUSED),
                 context="add(alpha=)")
    tv = torch.from_numpy(p.copy()).addcmul_(torch.from_numpy(g), torch.from_numpy(e), value=lr)
    assert_claim("optim.fma_bits", actual=tv, expected=ref.fma(g * dtype(lr), e, p, FUSED),
                 context="addcmul_")
    for w in (0.1, 0.5, 0.9):
        te = torch.from_numpy(p.copy()).lerp_(torch.from_numpy(g), w)
        assert_claim("optim.fma_bits", actual=te, expected=ref.lerp(p, g, dtype(w), FUSED),
                     context=f"lerp_ w={w}")


@pytest.mark.slow
def test_fma_matches_unfused_torch_kernels_bitwise_under_default_capability() -> None:
    """Under ATEN_CPU_CAPABILITY=default torch does not fuse, and fma(fused=False) matches."""
    script = (
        "import numpy as np, torch\n"
        "from reference import fma as ref\n"
        "from parity.compare import assert_claim\n"
        "assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT'\n"
        "rng = np.random.default_rng(0)\n"
        "for dt in (np.float32, np.float64):\n"
        "    p, g = (rng.standard_normal(4099).astype(dt) for _ in range(2))\n"
        "    t = torch.from_numpy(p.copy()).add_(torch.from_numpy(g), alpha=-0.0123)\n"
        "    assert_claim('optim.fma_bits', actual=t, expected=ref.fma(g, dt(-0.0123), p, False))\n"
        "    t = torch.from_numpy(p.copy()).lerp_(torch.from_numpy(g), 0.7)\n"
        "    assert_claim('optim.fma_bits', actual=t, expected=ref.lerp(p, g, dt(0.7), False))\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


@settings(examples(40))
@given(hyper=optim_sgd_hyper(), dtype=DTYPES, shapes=optim_shapes(), steps=st.integers(1, 12),
       scale=optim_grad_scales(), new_lr=optim_lrs(), cut=st.integers(0, 12),
       seed=st.integers(0, 2**32 - 1), cross=st.booleans(), two_groups=st.booleans())
def test_sgd_matches_torch_bitwise_for_any_hyperparameters(
        device: str, hyper: dict, dtype: type, shapes: list, steps: int, scale: float,
        new_lr: float, cut: int, seed: int, cross: bool, two_groups: bool) -> None:
    """SGD params and momentum buffers stay bit-identical through lr changes and save/load."""
    skip_on_cuda(device)
    event(f"momentum={hyper['momentum']}, nesterov={hyper['nesterov']}")
    pairs = run_optimizers("SGD", hyper, dtype, shapes, steps, seed, grad_scale=scale,
                           lr_changes={cut // 2: new_lr}, save_at=cut, cross=cross,
                           two_groups=two_groups)
    _assert_all("optim.sgd_bits", pairs)


@settings(examples(40))
@given(name=st.sampled_from(["Adam", "AdamW"]), hyper=optim_adam_hyper(), dtype=DTYPES,
       shapes=optim_shapes(), steps=st.integers(1, 12), scale=optim_grad_scales(),
       new_lr=optim_lrs(), cut=st.integers(0, 12), seed=st.integers(0, 2**32 - 1),
       cross=st.booleans(), two_groups=st.booleans())
def test_adam_matches_torch_bitwise_given_torchs_sqrt(
        device: str, name: str, hyper: dict, dtype: type, shapes: list, steps: int, scale: float,
        new_lr: float, cut: int, seed: int, cross: bool, two_groups: bool) -> None:
    """Adam/AdamW params and state are bit-identical when only the sqrt is torch's."""
    skip_on_cuda(device)
    event(f"lerp branch: {'end' if abs(dtype(1 - hyper['betas'][0])) >= 0.5 else 'start'}")
    pairs = run_optimizers(name, hyper, dtype, shapes, steps, seed, grad_scale=scale,
                           lr_changes={cut // 2: new_lr}, save_at=cut, cross=cross,
                           two_groups=two_groups)
    _assert_all("optim.adam_bits", pairs)


@settings(examples(20))
@given(hyper=optim_adam_hyper(), dtype=DTYPES, shapes=optim_shapes(),
       steps=st.integers(1, 20), scale=optim_grad_scales(), seed=st.integers(0, 2**32 - 1))
def test_adam_moments_match_torch_bitwise_with_ieee_sqrt(
        device: str, hyper: dict, dtype: type, shapes: list, steps: int, scale: float,
        seed: int) -> None:
    """Without weight decay, Adam's moments never see the sqrt and stay bit-identical."""
    skip_on_cuda(device)
    hyper = {**hyper, "weight_decay": 0}
    pairs = run_optimizers("Adam", hyper, dtype, shapes, steps, seed, grad_scale=scale,
                           sqrt="ieee")
    _assert_all("optim.adam_moments_bits", [x for x in pairs if x[0].startswith("state")])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_sqrt_is_within_one_ulp_of_ieee_sqrt(device: str, dtype: type) -> None:
    """torch's CPU sqrt differs from the IEEE sqrt, by at most one ulp."""
    skip_on_cuda(device)
    v = np.abs(np.random.default_rng(11).standard_normal(100_000)).astype(dtype)
    t = torch_sqrt(v)
    claim_id = "optim.torch_sqrt_f32_ulps" if dtype == np.float32 else "optim.torch_sqrt_f64_ulps"
    assert_claim(claim_id, actual=t, expected=np.sqrt(v))
    assert np.any(t != np.sqrt(v)), "the documented difference was not reached"


SCHEDULE_ARGS = {
    "StepLR": st.fixed_dictionaries({"step_size": st.integers(1, 10),
                                     "gamma": st.floats(0.01, 1.0)}),
    "CosineAnnealingLR": st.fixed_dictionaries({"T_max": st.integers(1, 12),
                                                "eta_min": st.sampled_from([0.0, 1e-5, 0.01])}),
    "LinearLR": st.fixed_dictionaries({"start_factor": st.floats(0.01, 1.0),
                                       "end_factor": st.floats(0.0, 1.0),
                                       "total_iters": st.integers(1, 20)}),
}


@settings(examples(50))
@given(data=st.data(), kind=st.sampled_from(SCHEDULERS), base_lr=st.floats(1e-5, 1.0),
       steps=st.integers(1, 60), cut=st.integers(0, 60), cross=st.booleans())
def test_schedules_match_torch_bitwise_through_save_and_load(
        device: str, data: st.DataObject, kind: str, base_lr: float, steps: int, cut: int,
        cross: bool) -> None:
    """StepLR, CosineAnnealingLR and LinearLR give torch's lr sequence bit for bit."""
    kw = data.draw(SCHEDULE_ARGS[kind])
    if kind == "CosineAnnealingLR" and steps > 2 * kw["T_max"]:
        event("cosine: additive restart branch reached")
    r, t = run_schedules(kind, kw, base_lr, steps, save_at=cut, cross=cross, device=device)
    assert_claim("optim.schedules_bits", actual=t, expected=r)


def _stepped_torch_optimizer(name: str, dtype: type, shapes: list, seed: int, device: str
                             ) -> torch.optim.Optimizer:
    """A torch optimizer that has taken one step (so it holds state), on `device`."""
    rng = np.random.default_rng(seed)
    params = [torch.nn.Parameter(torch.from_numpy(np.asarray(rng.standard_normal(s))
                                                  .astype(dtype)).to(device)) for s in shapes]
    hyper = {"lr": 0.1, "momentum": 0.9} if name == "SGD" else {"lr": 0.1, "amsgrad": True}
    opt = getattr(topt, name)(params, **hyper)
    for p in params:
        p.grad = torch.from_numpy(np.asarray(rng.standard_normal(p.shape)).astype(dtype)).to(
            device)
    opt.step()
    return opt


@settings(examples(20))
@given(name=st.sampled_from(["SGD", "Adam", "AdamW"]), dtype=DTYPES, shapes=optim_shapes(),
       seed=st.integers(0, 2**32 - 1))
def test_optimizer_state_round_trips_bitwise(device: str, name: str, dtype: type, shapes: list,
                                             seed: int) -> None:
    """torch -> reference -> torch and reference -> torch -> reference change no bit."""
    sd = _stepped_torch_optimizer(name, dtype, shapes, seed, device).state_dict()
    mid = tstate.optimizer_state_from_torch(sd, name)
    back = tstate.optimizer_state_to_torch(mid, name)
    again = tstate.optimizer_state_from_torch(back, name)
    assert back["param_groups"] == sd["param_groups"]
    assert again["param_groups"] == mid["param_groups"]
    assert sorted(back["state"]) == sorted(sd["state"]) == sorted(again["state"])
    for i, entries in sd["state"].items():
        assert sorted(back["state"][i]) == sorted(entries)
        for k, v in entries.items():
            assert_claim("optim.state_roundtrip_bits", actual=back["state"][i][k], expected=v,
                         context=f"[{i}][{k}]")
            assert_claim("optim.state_roundtrip_bits", actual=again["state"][i][k],
                         expected=mid["state"][i][k])


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_converted_groups_hold_exactly_each_sides_keys(device: str, name: str) -> None:
    """to_torch writes exactly the installed torch's group keys, from_torch exactly the
    reference's (whatever the torch version: the table in torch_impl/state_mapping.py)."""
    ref_opt = getattr(ref_optim, name)([Parameter(np.zeros(3))], lr=0.1)
    sd = _stepped_torch_optimizer(name, np.float64, [(3,)], 0, device).state_dict()
    to_torch = tstate.optimizer_state_to_torch(ref_opt.state_dict(), name)
    from_torch = tstate.optimizer_state_from_torch(sd, name)
    assert set(to_torch["param_groups"][0]) == set(sd["param_groups"][0])
    assert set(from_torch["param_groups"][0]) == set(ref_opt.state_dict()["param_groups"][0])


def _stepped_torch_scheduler(device: str) -> torch.optim.lr_scheduler.LRScheduler:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=device))], lr=0.3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)
    for _ in range(3):
        opt.step()
        sched.step()
    return sched


def test_scheduler_state_round_trips_exactly(device: str) -> None:
    """A torch scheduler's state survives torch -> reference -> torch unchanged, and the
    reference's survives reference -> torch -> reference; each holds exactly its side's keys."""
    sd = _stepped_torch_scheduler(device).state_dict()
    mid = tstate.scheduler_state_from_torch(sd)
    back = tstate.scheduler_state_to_torch(mid)
    assert back == sd
    ref_sched = ref_lr.CosineAnnealingLR(ref_optim.SGD([Parameter(np.zeros(1))], lr=0.3), T_max=5)
    ref_sched.step()
    ref_sd = ref_sched.state_dict()
    assert set(mid) == set(ref_sd)
    assert tstate.scheduler_state_from_torch(tstate.scheduler_state_to_torch(ref_sd)) == ref_sd
    assert_claim("optim.state_roundtrip_bits", actual=np.array(back["_last_lr"]),
                 expected=np.array(sd["_last_lr"]))


def test_conversion_refuses_a_non_default_torch_path(device: str) -> None:
    """A torch state_dict saved with foreach=True names the switch the reference lacks."""
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, device=device))], foreach=True)
    with pytest.raises(ValueError, match="foreach"):
        tstate.optimizer_state_from_torch(opt.state_dict(), "Adam")


# -- torch versions: a torch without decoupled_weight_decay, with `verbose`, without
# `_is_initial` (2.6.0), simulated on whichever torch is installed
def _as_torch_2_6(monkeypatch: pytest.MonkeyPatch) -> None:
    real_groups, real_sched = tstate.torch_group_keys, tstate.torch_scheduler_keys
    monkeypatch.setattr(tstate, "torch_group_keys",
                        lambda name: real_groups(name) - {"decoupled_weight_decay"})
    monkeypatch.setattr(tstate, "torch_scheduler_keys",
                        lambda: (real_sched() - {"_is_initial"}) | {"verbose"})


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_conversion_to_a_torch_without_decoupled_weight_decay_round_trips(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Where torch's groups lack decoupled_weight_decay, to_torch drops it (it is implied by
    the class) and from_torch restores it from the optimizer's name."""
    _as_torch_2_6(monkeypatch)
    sd = ref_optim.AdamW([Parameter(np.zeros(2))]).state_dict() if name == "AdamW" else \
        ref_optim.Adam([Parameter(np.zeros(2))]).state_dict()
    theirs = tstate.optimizer_state_to_torch(sd, name)
    assert "decoupled_weight_decay" not in theirs["param_groups"][0]
    assert tstate.optimizer_state_from_torch(theirs, name) == sd
    with pytest.raises(ValueError, match="pass optimizer='Adam' or 'AdamW'"):
        tstate.optimizer_state_from_torch(theirs)


def test_conversion_refuses_decoupled_decay_a_torch_adam_cannot_express(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Adam(decoupled_weight_decay=True) has no twin in a torch whose Adam lacks the key."""
    _as_torch_2_6(monkeypatch)
    sd = ref_optim.Adam([Parameter(np.zeros(2))], decoupled_weight_decay=True).state_dict()
    with pytest.raises(ValueError, match="always behaves as decoupled_weight_decay=False"):
        tstate.optimizer_state_to_torch(sd, "Adam")


def test_scheduler_conversion_for_a_torch_with_verbose_and_without_is_initial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch saves `verbose` and no `_is_initial`, the conversion swaps exactly those."""
    _as_torch_2_6(monkeypatch)
    ref_sd = ref_lr.StepLR(ref_optim.SGD([Parameter(np.zeros(1))], lr=0.3), step_size=2
                           ).state_dict()
    theirs = tstate.scheduler_state_to_torch(ref_sd)
    assert "_is_initial" not in theirs and theirs["verbose"] is False
    assert tstate.scheduler_state_from_torch(theirs) == ref_sd
    with pytest.raises(ValueError, match="verbose=True cannot be mapped"):
        tstate.scheduler_state_from_torch({**theirs, "verbose": True})
