"""Parity of reference.optim_kahan with torch_impl.optim_kahan (claim optim.kahan_twins), the
reference against each source's step written apart on exact rationals and against hand
vectors (optim.kahan_rule), and what the compensation buys: p + c follows an fp32 master
run where plain bf16 AdamW does not move (optim.kahan_tracks_master).
"""

from __future__ import annotations

import math
from fractions import Fraction as F

import ml_dtypes
import numpy as np
import pytest
import torch

from common.format_spec import get_format
from parity.compare import assert_claim
from parity.drivers.optim import FUSED, bf16_from_torch, bf16_to_torch, torch_sqrt
from parity.oracles import round_exact
from reference import optim_kahan as ref
from reference.module import Parameter
from torch_impl import optim_kahan as tk

BF16 = np.dtype(ml_dtypes.bfloat16)
CPU_KERNELS = ("AdamWKahan's twin claim is about torch's eager CPU kernels (NOTE [ FMA in "
               "torch's CPU kernels ], NOTE [ torch's CPU sqrt is MKL's ])")


def torch_pow(base: np.floating, exponent: np.ndarray) -> np.ndarray:
    """torch's float32 pow of a Python float and a 0-d tensor (glibc's powf on this CPU)."""
    return (float(base) ** torch.from_numpy(np.array(exponent, np.float32))).numpy()


def _codes(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16 if a.dtype == BF16 else np.uint32)


def _to_torch(a: np.ndarray) -> torch.Tensor:
    return bf16_to_torch(a) if a.dtype == BF16 else torch.from_numpy(np.array(a))


def _from_torch(t: torch.Tensor) -> np.ndarray:
    return bf16_from_torch(t) if t.dtype == torch.bfloat16 else t.detach().numpy()


def test_kahan_steps_match_between_trees_bitwise(device: str) -> None:
    """Four Kahan AdamW steps with weight decay on a bf16 parameter, the same gradients in
    each tree: the parameters and compensations are bit-identical (given torch's sqrt, pow)."""
    if device != "cpu":
        pytest.skip(CPU_KERNELS)
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(np.float32).astype(BF16)  # (4, 3)
    grads = rng.standard_normal((4, 4, 3)).astype(np.float32).astype(BF16)  # (steps, 4, 3)
    ref_p = Parameter(init.copy())
    torch_p = torch.nn.Parameter(bf16_to_torch(init))
    ref_opt = ref.AdamWKahan([ref_p], lr=0.05, weight_decay=0.1, fma=FUSED, sqrt=torch_sqrt,
                             pow=torch_pow)
    torch_opt = tk.AdamWKahan([torch_p], lr=0.05, weight_decay=0.1)
    for g in grads:
        ref_p.grad = g
        torch_p.grad = bf16_to_torch(g)
        ref_opt.step()
        torch_opt.step()
    ref_c = ref_opt.state[ref_p]["compensation"]  # (4, 3) bf16
    torch_c = torch_opt.state[torch_p]["compensation"]  # (4, 3) bf16
    assert np.any(_codes(ref_c) != 0), "the compensation holds something"
    assert_claim("optim.kahan_twins", actual=_codes(bf16_from_torch(torch_c)),
                 expected=_codes(ref_c), context="compensation")
    assert_claim("optim.kahan_twins", actual=_codes(bf16_from_torch(torch_p)),
                 expected=_codes(ref_p.data))


CONFIGS = [("anyprecision", True, BF16), ("optimi", True, BF16), ("anyprecision", False, BF16),
           ("optimi", False, BF16), ("anyprecision", False, np.dtype(np.float32))]
IDS = [f"{v}-{'kahan' if k else 'plain'}-{d}" for v, k, d in CONFIGS]


def _params(rng: np.random.Generator, shapes: list[tuple[int, ...]], dtype: np.dtype
            ) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


def _grads(rng: np.random.Generator, shapes: list[tuple[int, ...]], dtype: np.dtype,
           step: int) -> list[np.ndarray]:
    """Gradients of every scale: 10^-4 .. 10^1 by step."""
    return [(rng.standard_normal(s) * 10.0 ** (step % 6 - 4)).astype(np.float32).astype(dtype)
            for s in shapes]


@pytest.mark.parametrize(("variant", "kahan", "dtype"), CONFIGS, ids=IDS)
def test_kahan_state_matches_between_trees_over_many_steps(
        device: str, variant: str, kahan: bool, dtype: np.dtype) -> None:
    """Every state entry and parameter over 24 steps of three parameters (one 0-d), with
    weight decay, both variants, Kahan on and off, float32 parameters with it off."""
    if device != "cpu":
        pytest.skip(CPU_KERNELS)
    rng = np.random.default_rng(len(variant) + kahan)
    shapes = [(67,), (), (5, 3)]
    ref_ps = [Parameter(x) for x in _params(rng, shapes, dtype)]
    torch_ps = [torch.nn.Parameter(_to_torch(p.data)) for p in ref_ps]
    kw = {"lr": 0.02, "betas": (0.9, 0.95), "weight_decay": 0.2, "kahan": kahan,
          "variant": variant}
    ref_opt = ref.AdamWKahan(ref_ps, fma=FUSED, sqrt=torch_sqrt, pow=torch_pow, **kw)
    torch_opt = tk.AdamWKahan(torch_ps, **kw)
    for step in range(24):
        for rp, tp, g in zip(ref_ps, torch_ps, _grads(rng, shapes, dtype, step), strict=True):
            rp.grad, tp.grad = g, _to_torch(g)
        ref_opt.step()
        torch_opt.step()
    for rp, tp in zip(ref_ps, torch_ps, strict=True):
        assert set(ref_opt.state[rp]) == set(torch_opt.state[tp])
        for name, value in ref_opt.state[rp].items():
            theirs = _from_torch(torch_opt.state[tp][name])
            assert theirs.dtype == value.dtype, name
            assert_claim("optim.kahan_twins", actual=_codes(theirs), expected=_codes(value),
                         context=name)
        assert_claim("optim.kahan_twins", actual=_codes(_from_torch(tp)), expected=_codes(rp.data))


# -- each source's step written apart: exact rationals, rounded as each kernel rounds --------
FP32, BF = get_format("float32"), get_format("bfloat16")


def r32(x: F | float) -> float:
    """A float32 kernel's result: x rounded once to float32."""
    return round_exact(F(x), FP32)


def rbf(x: F | float) -> float:
    """A kernel writing a bf16 tensor: its float32 result, rounded again to bfloat16."""
    return round_exact(F(r32(x)), BF)


def sqrt32(x: float) -> float:
    """IEEE's float32 sqrt: float64's correctly rounded sqrt rounded again (53 >= 2*24 + 2)."""
    return r32(math.sqrt(x))


def source_step(p: float, g: float, s: dict[str, float], *, variant: str, kahan: bool,
                into: object, zero_d: bool, lr: float, betas: tuple[float, float],
                eps: float, wd: float) -> float:
    """One element through AnyPrecisionAdamW's step (or optimi's), line by line."""
    b1, b2 = betas
    s["step"] = r32(F(s["step"]) + 1)
    if wd:
        p = into(F(p) * F(r32(1 - lr * wd)))  # p.data.mul_(1 - lr * weight_decay)
    if variant == "anyprecision":  # m float32, v bfloat16
        s["exp_avg"] = r32(F(g) * F(r32(1 - b1)) + F(r32(F(s["exp_avg"]) * F(r32(b1)))))
        v = rbf(F(s["exp_avg_sq"]) * F(r32(b2)))  # exp_avg_sq.mul_(beta2)
        s["exp_avg_sq"] = rbf(F(r32(F(r32(1 - b2)) * F(g))) * F(g) + F(v))  # .addcmul_
        c1 = r32(1 - F(r32(float(r32(b1)) ** s["step"])))  # 1 - beta1**step, float32
        step_size = r32(F(r32(1 / F(c1))) * F(r32(lr)))  # lr / c1: reciprocal, then * lr
        c2 = sqrt32(r32(1 - F(r32(float(r32(b2)) ** s["step"]))))  # (...) ** 0.5
        cv = r32 if zero_d else rbf  # NOTE [ A 0-d parameter's denominator ]
        d = cv(F(cv(F(rbf(sqrt32(s["exp_avg_sq"]))) / F(c2))) + F(r32(eps)))
        u = r32(F(r32(-F(step_size) * F(s["exp_avg"]))) / F(d))
    else:  # optimi: state in p's dtype, debiased betas in Python floats
        k = int(s["step"])
        b1h, b2h = (b1**k - b1) / (b1**k - 1), (b2**k - b2) / (b2**k - 1)
        w, m = r32(1 - b1h), s["exp_avg"]
        diff = r32(F(g) - F(m))  # torch's lerp: anchored at the nearer end, one rounding
        s["exp_avg"] = into(F(w) * F(diff) + F(m) if abs(w) < 0.5
                            else F(r32(F(w) - 1)) * F(diff) + F(g))
        v = into(F(s["exp_avg_sq"]) * F(r32(b2h)))
        s["exp_avg_sq"] = into(F(r32(F(r32(1 - b2h)) * F(g))) * F(g) + F(v))
        d = into(F(into(sqrt32(s["exp_avg_sq"]))) + F(r32(eps)))  # sqrt().add_(eps)
        u = r32(F(r32(F(r32(-lr)) * F(s["exp_avg"]))) / F(d))
    if not kahan:
        return into(F(p) + F(u))  # p.addcdiv_(exp_avg, denom, value=-step_size)
    c = rbf(F(s["compensation"]) + F(u))  # compensation.addcdiv_(...)
    new = into(F(p) + F(c))  # p.add_(compensation)
    s["compensation"] = rbf(F(c) + F(into(F(p) - F(new))))  # compensation.add_(old - p)
    return new


@pytest.mark.parametrize(("variant", "kahan", "dtype"), CONFIGS, ids=IDS)
def test_reference_follows_the_sources_rule_written_apart(
        variant: str, kahan: bool, dtype: np.dtype) -> None:
    """Six steps with weight decay of a (9,) and a 0-d parameter: every state entry and the
    parameters equal the source's lines computed on exact rationals; the decay moved them."""
    rng = np.random.default_rng(7)
    shapes = [(9,), ()]
    hyper = {"lr": 0.05, "betas": (0.9, 0.95), "eps": 1e-8, "wd": 0.1}
    into = rbf if dtype == BF16 else r32
    init = _params(rng, shapes, dtype)
    ours = [Parameter(x.copy()) for x in init]
    opt = ref.AdamWKahan(ours, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"],
                         weight_decay=hyper["wd"], kahan=kahan, variant=variant)
    theirs = [[float(v) for v in x.astype(np.float64).reshape(-1)] for x in init]
    states = [[dict.fromkeys(("step", "exp_avg", "exp_avg_sq", "compensation"), 0.0)
               for _ in row] for row in theirs]
    for step in range(6):
        for i, g in enumerate(_grads(rng, shapes, dtype, step + 3)):
            ours[i].grad = g
            theirs[i] = [source_step(p, float(gj), s, variant=variant, kahan=kahan, into=into,
                                     zero_d=not shapes[i], **hyper)
                         for p, gj, s in zip(theirs[i], g.astype(np.float64).reshape(-1),
                                             states[i], strict=True)]
        opt.step()
    for p, row, st in zip(ours, theirs, states, strict=True):
        assert_claim("optim.kahan_rule", actual=p.data.astype(np.float64).reshape(-1),
                     expected=np.array(row))
        for name, value in opt.state[p].items():
            expected = [s[name] for s in st][:value.size]  # step: one per parameter
            assert_claim("optim.kahan_rule", actual=value.astype(np.float64).reshape(-1),
                         expected=np.array(expected), context=name)
    undecayed = ref.AdamWKahan([q := Parameter(init[0].copy())], lr=hyper["lr"],
                               betas=hyper["betas"], kahan=kahan, variant=variant)
    rng = np.random.default_rng(7)
    _params(rng, shapes, dtype)
    for step in range(6):
        q.grad = _grads(rng, shapes, dtype, step + 3)[0]
        undecayed.step()
    assert not np.array_equal(q.data, ours[0].data), "the weight decay changed the weights"


@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_kahan_hand_vector(variant: str) -> None:
    """betas (0, 0), eps 0, lr 2^-9, g = -1: every update is exactly u = 2^-9, a quarter of
    bf16's spacing 2^-7 at 1. From p = 1: c = 2^-9, p = 1; c = 2^-8, p = 1 (1 + 2^-8 ties to
    the even 1); c = 3 2^-9 rounds p up to 1 + 2^-7, c = 3 2^-9 - 2^-7 = -2^-9; c = 0. Plain
    AdamW stays at 1 (1 + 2^-9 rounds to 1)."""
    truth_p = np.array([1.0, 1.0, 1 + 2.0**-7, 1 + 2.0**-7])
    truth_c = np.array([2.0**-9, 2.0**-8, -(2.0**-9), 0.0])
    seen = {True: ([], []), False: ([], [])}
    for kahan, (ps, cs) in seen.items():
        p = Parameter(np.ones((), BF16))
        opt = ref.AdamWKahan([p], lr=2.0**-9, betas=(0.0, 0.0), eps=0.0, kahan=kahan,
                             variant=variant)
        for _ in range(4):
            p.grad = -np.ones((), BF16)
            opt.step()
            ps.append(float(p.data))
            cs.append(float(opt.state[p].get("compensation", 0.0)))
    assert_claim("optim.kahan_rule", actual=np.array(seen[True][0]), expected=truth_p)
    assert_claim("optim.kahan_rule", actual=np.array(seen[True][1]), expected=truth_c)
    assert_claim("optim.kahan_rule", actual=np.array(seen[False][0]), expected=np.ones(4))
    exact = 1 + np.arange(1, 5) * 2.0**-9  # the exact sum of the updates
    assert np.array_equal(truth_p + truth_c, exact), "p + c is the exact sum at every step"


def test_kahan_tracks_the_fp32_master_where_plain_bf16_stands_still() -> None:
    """256 steps of updates near 0.3 bf16 spacings on 64 weights in [1, 1.5): plain bf16
    AdamW never moves a weight; Kahan's p + c stays within the derived bound of the fp32
    master run (the same AdamW on float32 copies), which moved each weight ~77 spacings."""
    k, n, lr = 256, 64, 0.6 * 2.0**-9  # lr < s / 2 = 2^-8 at s = 2^-7
    rng = np.random.default_rng(0)
    w0 = (1 + rng.integers(0, 64, n) / 128).astype(np.float32).astype(BF16)  # (64,)
    runs = {}
    for name, dtype, kahan in (("plain", BF16, False), ("kahan", BF16, True),
                               ("master", np.dtype(np.float32), False)):
        p = Parameter(w0.astype(dtype))
        runs[name] = (p, ref.AdamWKahan([p], lr=lr, kahan=kahan))
    for _ in range(k):
        g = -(0.5 + rng.random(n)).astype(np.float32).astype(BF16)  # (64,), one sign
        for p, opt in runs.values():
            p.grad = g.astype(p.data.dtype)
            opt.step()
    (plain, _), (kahan, kahan_opt), (master, _) = runs.values()
    w = kahan.data.astype(np.float32) + kahan_opt.state[kahan]["compensation"].astype(
        np.float32)  # exact: c is below half of p's spacing
    spacing = 2.0 ** (np.floor(np.log2(master.data)) - 7)  # bf16's s at the weight, (64,)
    assert np.array_equal(spacing, np.full(n, 2.0**-7)), "every weight stayed in [1, 2)"
    assert np.array_equal(_codes(plain.data), _codes(w0)), "plain bf16 AdamW never moved"
    assert np.all(master.data - w0.astype(np.float32) > 32 * spacing), "the master moved"
    scale = k * spacing
    plain_units = np.max(np.abs(plain.data.astype(np.float32) - master.data)
                         / (np.finfo(np.float32).eps * scale))
    assert_claim("optim.kahan_tracks_master", actual=w, expected=master.data, scale=scale,
                 context=f"(plain bf16 AdamW: {plain_units:.0f} eps k s)")


BAD_HYPER = [
    ("a negative lr", {"lr": -1.0}),
    ("beta1 of 1", {"betas": (1.0, 0.999)}),
    ("a negative beta2", {"betas": (0.9, -0.5)}),
    ("a negative eps", {"eps": -1e-8}),
    ("a negative weight decay", {"weight_decay": -0.1}),
    ("an unknown variant", {"variant": "torchao"}),
]


@pytest.mark.parametrize(("label", "kw"), BAD_HYPER, ids=[b[0] for b in BAD_HYPER])
def test_bad_hyperparameters_are_one_line_the_same_in_both_trees(label: str, kw: dict) -> None:
    """Each bad constructor argument is the same ValueError line in both trees."""
    with pytest.raises(ValueError) as ours:
        ref.AdamWKahan([Parameter(np.zeros(2, BF16))], **kw)
    with pytest.raises(ValueError) as theirs:
        tk.AdamWKahan([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], **kw)
    assert str(ours.value) == str(theirs.value) and "\n" not in str(ours.value), label


BAD_DTYPES = [
    ("float16 parameters", np.float16, np.float16, True,
     "AdamWKahan: parameters must be bfloat16 or float32, got float16"),
    ("float32 parameters with Kahan", np.float32, np.float32, True,
     "AdamWKahan: kahan=True needs bfloat16 parameters, got float32"),
    ("a float32 gradient", BF16, np.float32, True,
     "AdamWKahan: a bfloat16 parameter has a float32 gradient"),
]


@pytest.mark.parametrize(("label", "p_dtype", "g_dtype", "kahan", "line"), BAD_DTYPES,
                         ids=[b[0] for b in BAD_DTYPES])
def test_bad_dtypes_are_one_line_the_same_in_both_trees(label: str, p_dtype: type,
                                                        g_dtype: type, kahan: bool,
                                                        line: str) -> None:
    """A parameter or gradient of a dtype the step cannot take is the same TypeError line."""
    ref_p = Parameter(np.zeros(2, p_dtype))
    ref_p.grad = np.zeros(2, g_dtype)
    torch_p = torch.nn.Parameter(_to_torch(np.zeros(2, p_dtype)))
    if p_dtype != g_dtype:  # torch refuses such a gradient unless told to take any dtype
        torch_p.grad_dtype = None
    torch_p.grad = _to_torch(np.zeros(2, g_dtype))
    messages = []
    for opt in (ref.AdamWKahan([ref_p], kahan=kahan), tk.AdamWKahan([torch_p], kahan=kahan)):
        with pytest.raises(TypeError) as err:
            opt.step()
        messages.append(str(err.value))
    assert messages == [line, line], label
