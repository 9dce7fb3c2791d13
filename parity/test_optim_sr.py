"""Parity of reference.optim_sr with torch_impl.optim_sr (claim optim.sr_twins), and the
reference's stochastic rounding against its two oracles that need no torchao: the formats'
stochastic encoder fed the same bits as 32-bit words (optim.sr_bf16_formats), and its
expected value (optim.sr_bf16_unbiased). torchao itself: parity/test_optim_sr_torchao.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from parity.compare import assert_claim, assert_observed
from parity.drivers.optim import bf16_from_torch, bf16_to_torch, torch_sqrt
from parity.strategies import SR_EDGES, examples, sr_bf16_inputs, sr_edge_bits
from reference import formats as ref_formats
from reference import optim_sr as ref
from reference.module import Parameter
from torch_impl import optim_sr as tsr

CPU_KERNELS = ("AdamWSR's twin claim is about torch's eager CPU kernels (NOTE [ FMA in torch's "
               "CPU kernels ], NOTE [ torch's CPU sqrt is MKL's ])")


def _codes(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def _all_draw_classes(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each input against the draws that decide it: 0, low - 1, low, low + 1 and 2^16 - 1
    (clipped to [0, 2^16)), so every input is seen rounded both ways where it can be."""
    low = (bits & 0xFFFF).astype(np.int64)
    draws = np.stack([np.zeros_like(low), low - 1, low, low + 1,
                      np.full_like(low, 0xFFFF)]).clip(0, 0xFFFF)  # (5, n)
    return np.broadcast_to(bits, draws.shape).copy(), draws


def test_sr_bf16_equals_the_formats_encoder_on_every_edge() -> None:
    """round_bf16_stochastic(x, r) is encode(x, bfloat16, stochastic, random_bits=r << 16)
    on every edge of SR_EDGES, each against the draws on both sides of its threshold."""
    bits, draws = _all_draw_classes(sr_edge_bits())  # (5, n)
    x = bits.view(np.float32)
    ours = ref.round_bf16_stochastic(x, draws)
    theirs = ref_formats.encode(x, "bfloat16", rounding="stochastic",
                                random_bits=draws.astype(np.uint64) << 16)
    assert_claim("optim.sr_bf16_formats", actual=_codes(ours), expected=theirs.astype(np.uint16))
    moved = _codes(ours) != (bits >> 16)
    assert moved.any() and not moved.all(), "the edges were rounded both ways"


@examples(200)
@given(sr_bf16_inputs(), st.data())
def test_sr_bf16_equals_the_formats_encoder_for_any_bits(bits: np.ndarray,
                                                         data: st.DataObject) -> None:
    """The same on any float32 bits with any draws."""
    draws = np.array(data.draw(st.lists(st.integers(0, 0xFFFF), min_size=bits.size,
                                        max_size=bits.size)), dtype=np.int32)
    x = bits.view(np.float32)
    event("NaN input" if np.isnan(x).any() else "no NaN input")
    ours = ref.round_bf16_stochastic(x, draws)
    theirs = ref_formats.encode(x, "bfloat16", rounding="stochastic",
                                random_bits=draws.astype(np.uint64) << 16)
    assert_claim("optim.sr_bf16_formats", actual=_codes(ours), expected=theirs.astype(np.uint16))


def test_sr_bf16_is_unbiased() -> None:
    """The mean of SR(x) over many uniform draws is x, for 64 values of every p."""
    rng = np.random.default_rng(20240601)
    low = np.concatenate([[1, 0x8000, 0xFFFF], rng.integers(1, 1 << 16, 61)])  # (64,)
    high = rng.integers(0x0001, 0x7F7F, 64) | 0  # upper halves of finite, nonzero floats
    signs = rng.integers(0, 2, 64) << 15
    bits = (((high | signs) << 16) | low).astype(np.uint32)
    x = bits.view(np.float32)  # (64,)
    n = 8192
    draws = rng.integers(0, 1 << 16, (n, x.size))  # (N, 64)
    y = ref.round_bf16_stochastic(np.broadcast_to(x, draws.shape).copy(), draws)
    down = (bits & 0xFFFF0000).view(np.float32).astype(np.float64)
    spacing = np.abs(((bits & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64) - down)
    ups = np.abs(y.astype(np.float64) - down) / spacing  # (N, 64): 0 or 1
    assert np.isin(ups, (0.0, 1.0)).all(), "every result is one of x's two neighbours"
    p = low / 65536.0  # exact: the probability of rounding up
    z = (ups.sum(axis=0) - n * p).sum() / math.sqrt(n * (p * (1 - p)).sum())
    mean_error = float(np.max(np.abs(ups.mean(axis=0) * spacing + down - x.astype(np.float64))
                              / spacing))
    assert_observed("optim.sr_bf16_unbiased", math.erfc(abs(z) / math.sqrt(2)), ups.size,
                    f"z = {z:.3f}, largest |mean - x| = {mean_error:.4f} spacings")


def test_adamw_sr_steps_match_between_trees_bitwise(device: str) -> None:
    """Four AdamWSR steps on a bf16 parameter, the same gradients and the same draws in each
    tree, leave the parameters and moments bit-identical (given torch's sqrt)."""
    if device != "cpu":
        pytest.skip(CPU_KERNELS)
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(np.float32)  # (4, 3)
    grads = rng.standard_normal((4, 4, 3)).astype(np.float32)  # (steps, 4, 3)
    draws = rng.integers(0, 1 << 16, (4, 4, 3), dtype=np.int32)  # (steps, 4, 3)
    ref_p = Parameter(ref.round_bf16_stochastic(init, draws[0]))
    torch_p = torch.nn.Parameter(bf16_to_torch(ref_p.data))
    ref_opt = ref.AdamWSR([ref_p], lr=0.01, weight_decay=0.1, sqrt=torch_sqrt)
    torch_opt = tsr.AdamWSR([torch_p], lr=0.01, weight_decay=0.1)
    for g, r in zip(grads, draws, strict=True):
        ref_p.grad = ref.round_bf16_stochastic(g, r)
        torch_p.grad = bf16_to_torch(ref_p.grad)
        ref_opt.step([r])
        torch_opt.step([torch.from_numpy(r)])
    ref_m = ref_opt.state[ref_p]["exp_avg"]  # (4, 3) bf16
    torch_m = torch_opt.state[torch_p]["exp_avg"]  # (4, 3) bf16
    assert_claim("optim.sr_twins", actual=_codes(bf16_from_torch(torch_m)), expected=_codes(ref_m),
                 context="exp_avg")
    assert_claim("optim.sr_twins", actual=_codes(bf16_from_torch(torch_p)),
                 expected=_codes(ref_p.data))


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adamw_sr_state_matches_between_trees_over_many_steps(device: str, amsgrad: bool) -> None:
    """Every state entry, over 8 steps of two parameters (one 0-d), gradients of every scale."""
    if device != "cpu":
        pytest.skip(CPU_KERNELS)
    rng = np.random.default_rng(int(amsgrad))
    shapes = [(67,), ()]
    ref_ps = [Parameter(ref.round_bf16_stochastic(
        rng.standard_normal(s).astype(np.float32), np.zeros(s, np.int32))) for s in shapes]
    torch_ps = [torch.nn.Parameter(bf16_to_torch(p.data)) for p in ref_ps]
    kw = {"lr": 3e-3, "betas": (0.9, 0.95), "weight_decay": 0.1, "amsgrad": amsgrad}
    ref_opt = ref.AdamWSR(ref_ps, sqrt=torch_sqrt, **kw)
    torch_opt = tsr.AdamWSR(torch_ps, **kw)
    for step in range(8):
        draws = [rng.integers(0, 1 << 16, s, dtype=np.int32) for s in shapes]
        for rp, tp, s in zip(ref_ps, torch_ps, shapes, strict=True):
            g = (rng.standard_normal(s) * 10.0 ** (step - 4)).astype(np.float32)
            rp.grad = ref.round_bf16_stochastic(g, np.zeros(s, np.int32))
            tp.grad = bf16_to_torch(rp.grad)
        ref_opt.step(draws)
        torch_opt.step([torch.from_numpy(d) for d in draws])
    for rp, tp in zip(ref_ps, torch_ps, strict=True):
        for name, value in ref_opt.state[rp].items():
            theirs = torch_opt.state[tp][name]
            if name == "step":
                assert_claim("optim.sr_twins", actual=theirs.numpy(), expected=value)
                continue
            assert_claim("optim.sr_twins", actual=_codes(bf16_from_torch(theirs)),
                         expected=_codes(value), context=name)
        assert_claim("optim.sr_twins", actual=_codes(bf16_from_torch(tp)), expected=_codes(rp.data))


@examples(200)
@given(sr_bf16_inputs(), st.data())
def test_round_bf16_stochastic_matches_between_trees(device: str, bits: np.ndarray,
                                                     data: st.DataObject) -> None:
    """Both variants on any float32 bits: 'ieee' bit for bit, 'torchao' NaN as a class."""
    draws = np.array(data.draw(st.lists(st.integers(0, 0xFFFF), min_size=bits.size,
                                        max_size=bits.size)), dtype=np.int32)
    x = bits.view(np.float32)
    xt = torch.from_numpy(x.copy()).to(device)
    rt = torch.from_numpy(draws).to(device)
    ours = ref.round_bf16_stochastic(x, draws)
    theirs = bf16_from_torch(tsr.round_bf16_stochastic(xt, rt))
    assert_claim("optim.sr_twins", actual=_codes(theirs), expected=_codes(ours))
    ours = ref.round_bf16_stochastic(x, draws, variant="torchao").astype(np.float32)
    theirs = bf16_from_torch(tsr.round_bf16_stochastic(xt, rt, variant="torchao"))
    assert_claim("optim.sr_twins", actual=theirs.astype(np.float32)[~np.isnan(ours)],
                 expected=ours[~np.isnan(ours)], context="variant torchao, non-NaN results")
    assert np.array_equal(np.isnan(theirs.astype(np.float32)), np.isnan(ours))


BAD_ROUNDING = [
    ("float64 x", np.zeros(3), np.zeros(3, np.int32), {}),
    ("float draws", np.zeros(3, np.float32), np.zeros(3, np.float32), {}),
    ("draws of another shape", np.zeros(3, np.float32), np.zeros(2, np.int32), {}),
    ("a draw of 2^16", np.zeros(3, np.float32), np.full(3, 1 << 16, np.int32), {}),
    ("a negative draw", np.zeros(3, np.float32), np.full(3, -1, np.int32), {}),
    ("an unknown variant", np.zeros(3, np.float32), np.zeros(3, np.int32), {"variant": "llm.c"}),
]


@pytest.mark.parametrize(("label", "x", "draws", "kw"), BAD_ROUNDING,
                         ids=[b[0] for b in BAD_ROUNDING])
def test_bad_rounding_arguments_are_one_line_the_same_in_both_trees(
        label: str, x: np.ndarray, draws: np.ndarray, kw: dict) -> None:
    """Each bad argument raises the same exception type and one-line message in both trees."""
    with pytest.raises((TypeError, ValueError)) as ours:
        ref.round_bf16_stochastic(x, draws, **kw)
    with pytest.raises((TypeError, ValueError)) as theirs:
        tsr.round_bf16_stochastic(torch.from_numpy(x), torch.from_numpy(draws), **kw)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value) and "\n" not in str(ours.value), label


def test_bad_step_arguments_are_one_line_the_same_in_both_trees() -> None:
    """Too few draws, and a float32 parameter, are the same line in both trees."""
    ref_p = Parameter(np.zeros(2, np.float32).astype(ref.round_bf16_stochastic(
        np.zeros(2, np.float32), np.zeros(2, np.int32)).dtype))
    torch_p = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    ref_p.grad, torch_p.grad = ref_p.data.copy(), torch_p.detach().clone()
    messages = []
    for opt, draws in ((ref.AdamWSR([ref_p]), []), (tsr.AdamWSR([torch_p]), [])):
        with pytest.raises(ValueError) as err:
            opt.step(draws)
        messages.append(str(err.value))
    ref_f = Parameter(np.zeros(2, np.float32))
    torch_f = torch.nn.Parameter(torch.zeros(2))
    ref_f.grad, torch_f.grad = ref_f.data.copy(), torch_f.detach().clone()
    for opt, draws in ((ref.AdamWSR([ref_f]), [np.zeros(2, np.int32)]),
                       (tsr.AdamWSR([torch_f]), [torch.zeros(2, dtype=torch.int32)])):
        with pytest.raises(TypeError) as err:
            opt.step(draws)
        messages.append(str(err.value))
    assert messages[0] == messages[1] == "AdamWSR.step: 0 draws for 1 parameters with gradients"
    assert messages[2] == messages[3] == ("AdamWSR: parameters and gradients must be bfloat16, "
                                          "got float32")


def test_sr_edges_cover_every_named_class() -> None:
    """Each named edge class of SR_EDGES is non-empty and holds the class it names."""
    x = sr_edge_bits().view(np.float32)
    assert all(SR_EDGES.values())
    assert np.isnan(x).sum() == len(SR_EDGES["NaN"])
    assert np.isinf(x).sum() == len(SR_EDGES["infinities"])
