"""Parity of reference.amp (autocast emulation) with torch.autocast: op by op, the whole compact
model layer by layer, and the op lists. Drivers: parity/drivers/amp.py, amp_lists.py.

Every low-precision result is checked to be a member of its format before it is compared
(the drivers refuse non-members), so a missing rounding fails here instead of reading as
0 ulps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.claims.amp import ACTIVATION_MIN_COMPARED, LINEAR_MIN_COMPARED, MODEL_MIN_EXACT
from parity.compare import assert_claim
from parity.drivers import amp_lists
from parity.drivers.amp import (
    ACTIVATIONS,
    SUFFIX,
    activation_pairs,
    activation_pairs_at,
    dropout_pairs,
    f32,
    float32_accumulation,
    linear_pairs,
    linear_pairs_at,
    model_pairs,
    reliable,
)
from parity.drivers.amp_context import nested_states, saved_signatures
from parity.drivers.lp_ordinal import toward
from parity.strategies import examples
from reference import amp as ramp
from reference import nn as rnn
from torch_impl import state_mapping as tstate

FMTS = st.sampled_from(["bfloat16", "float16"])


def test_linear_forward_under_bf16_autocast_matches_torch_autocast(device: str) -> None:
    """A Linear under bfloat16 autocast gives bfloat16 outputs within 1 ulp of torch's where
    the float32 accumulation bound allows (amp.linear_bf16's precondition)."""
    rng = np.random.default_rng(0)
    ref_layer = rnn.Linear(16, 8, rng=rng)
    torch_layer = torch.nn.Linear(16, 8).to(device)
    torch_layer.load_state_dict(tstate.state_dict_to_torch(ref_layer.state_dict()))
    x = rng.standard_normal((4, 16)).astype(np.float32)  # (B, in)
    with ramp.autocast("bfloat16"):
        ref_y = f32(ref_layer.forward(x))  # (B, out): bfloat16 values
    with float32_accumulation(device), torch.autocast(torch.device(device).type,
                                                      dtype=torch.bfloat16):
        torch_y = f32(torch_layer(torch.from_numpy(x).to(device)))  # (B, out)
    lp = ramp.LP_DTYPES["bfloat16"]
    x_lp, w_lp = f32(ramp.cast(x, lp)), f32(ramp.cast(ref_layer.weight.data, lp))  # the operands
    ok = reliable(x_lp, w_lp.T, ref_y, "bfloat16")  # (B, out): float32 order cannot flip a rounding
    assert ok.mean() >= LINEAR_MIN_COMPARED  # the precondition holds where the claim says
    assert_claim("amp.linear_bf16", actual=torch_y[ok], expected=ref_y[ok])


@settings(examples(25))
@given(fmt=FMTS, n=st.integers(1, 40), k=st.integers(1, 96), m=st.integers(1, 24),
       seed=st.integers(0, 2**32 - 1))
def test_linear_under_autocast_within_one_lp_ulp_of_torch(fmt: str, n: int, k: int, m: int,
                                                          seed: int, device: str) -> None:
    """Output and all three gradients within 1 lp ulp where the accumulation bound allows
    (at least LINEAR_MIN_COMPARED of the elements); casts and master weights bit-identical."""
    compared = total = 0
    for label, a, b, ok in linear_pairs(fmt, n, k, m, seed, device):
        if label.startswith(("saved", "master")):
            assert_claim("amp.casts", actual=b, expected=a, context=label)
            continue
        event(f"{label}: precondition excluded {'some' if not ok.all() else 'none'}")
        assert_claim(f"amp.linear_{SUFFIX[fmt]}", actual=b[ok], expected=a[ok], context=label)
        compared, total = compared + int(ok.sum()), total + ok.size
    assert compared >= LINEAR_MIN_COMPARED * total, f"compared {compared} of {total} elements"


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_linear_reaches_its_one_ulp_bound_where_the_summation_order_decides(fmt: str,
                                                                            device: str) -> None:
    """Rows holding 1, half an lp ulp of 1 (2^-(p+1), p mantissa bits) and two 2^-24 in every
    order, weights 1: the exact sum sits 2^-23 above lp's rounding midpoint 1 + 2^-(p+1).
    Added left to right in float32, each 2^-24 ties back to 1 + 2^-(p+1), which rounds to even:
    1; the two 2^-24 added first keep their 2^-23: 1 + 2^-p. Trees whose float32 orders differ
    land one lp ulp apart, the bound of amp.linear_*, under its precondition (k 2^-24 sum|ab|
    = 2^-22 is far below half an ulp): on the CPU some orders always do."""
    import itertools

    from reference import nn as rnn

    p = {"bfloat16": 7, "float16": 10}[fmt]
    terms = (1.0, 2.0 ** -(p + 1), 2.0**-24, 2.0**-24)
    x = np.array(sorted(set(itertools.permutations(terms))), np.float32)  # (12, 4)
    layer = rnn.Linear(4, 1, rng=np.random.default_rng(0))
    layer.weight.data[...], layer.bias.data[...] = 1.0, 0.0  # type: ignore[union-attr]
    apart = 0
    for label, a, b, ok in linear_pairs_at(fmt, layer, x, np.ones((len(x), 1), np.float32),
                                           device):
        if label.startswith(("saved", "master")):
            assert_claim("amp.casts", actual=b, expected=a, context=label)
            continue
        assert ok.all(), label
        assert_claim(f"amp.linear_{SUFFIX[fmt]}", actual=b, expected=a,
                     context=f"{label}, order-sensitive midpoint")
        apart += int((a != b).sum()) if label == "y" else 0
    if device == "cpu":  # CUDA's GEMM order is its own: recorded, not required
        assert apart > 0, "no order separated the trees: the bound was not reached"


@settings(examples(20))
@given(fmt=FMTS, name=st.sampled_from(sorted(ACTIVATIONS)), seed=st.integers(0, 2**32 - 1))
def test_activations_on_lp_tensors_within_one_lp_ulp_of_torch(fmt: str, name: str, seed: int,
                                                              device: str) -> None:
    """Forward output and input gradient within 1 lp ulp where the float32 bound allows."""
    for label, a, b, ok in activation_pairs(name, fmt, 512, seed, device):
        assert ok.mean() >= ACTIVATION_MIN_COMPARED, f"{name} {label}: compared {ok.mean():.1%}"
        assert_claim(f"amp.activation_{SUFFIX[fmt]}", actual=b[ok], expected=a[ok],
                     context=f"{name} {label}")


# (x, g) where the trees' float32 GELU lands on either side of an lp rounding midpoint: found
# by running every finite lp x against six draws of g (393,000 pairs per format) with torch
# 2.13 on an AVX-512 CPU (get_cpu_capability() "AVX512"), inside long tensors: each point is
# repeated 64 times, since a lone element takes the kernel's scalar tail, which rounds these
# alike; another CPU's vector path may too (then 0 is observed)
MIDPOINT_GELU = {"bfloat16": ((-0.66796875, -0.50390625), (-3.140625, 1.0)),
                 "float16": ((-2.484375, 0.49072265625), (-0.01114654541015625,
                                                         -0.038604736328125))}


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_gelu_holds_its_one_ulp_bound_at_points_one_ulp_apart(fmt: str, device: str) -> None:
    """At the (x, g) of MIDPOINT_GELU the two float32 GELUs straddle an lp rounding midpoint:
    the results one lp ulp apart (on the CPU the search ran on), never more, under the
    precondition of amp.activation_*; random draws reach this about once in 10^5 pairs."""
    x, g = (np.repeat(np.array(v, np.float32), 64)
            for v in zip(*MIDPOINT_GELU[fmt], strict=True))
    for label, a, b, ok in activation_pairs_at("gelu", fmt, x, g, device):
        assert_claim(f"amp.activation_{SUFFIX[fmt]}", actual=b[ok], expected=a[ok],
                     context=f"gelu {label} midpoint")


@settings(examples(20))
@given(fmt=FMTS, p=st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.9]), seed=st.integers(0, 2**32 - 1))
def test_dropout_on_lp_tensors_is_torchs_bit_for_bit(fmt: str, p: float, seed: int,
                                                     device: str) -> None:
    """Given torch's keep-mask: output, saved lp mask and input gradient, the same bits."""
    if device != "cpu":
        pytest.skip("CPU-specific claim: CUDA fuses dropout (a bool mask, a float32 scale)")
    for label, a, b, _ in dropout_pairs(fmt, p, 256, seed):
        event(f"mask exact in {fmt}: {float(1 / (1 - p)) == float(a.max(initial=0))}"
              if label == "saved mask" else label)
        assert_claim("amp.dropout", actual=b, expected=a, context=f"{label} (p={p})")


@settings(examples(12))
@given(fmt=FMTS, activation=st.sampled_from(["gelu", "gelu_tanh", "tanh", "relu"]),
       seed=st.integers(0, 2**32 - 1))
def test_compact_model_layers_within_the_rounding_spread_of_torch(fmt: str, activation: str,
                                                                  seed: int,
                                                                  device: str) -> None:
    """Every layer of the reference's autocast run, given to torch with the same inputs and
    incoming gradient, within k ulps per element (k = 0, bit-identical, where no rounding
    boundary lies within the op's float32 bound of the exact result); the loss gradient
    bit-identical."""
    exact = total = 0
    for label, a, b, k in model_pairs(activation, fmt, seed, device):
        assert_claim(f"amp.model_{SUFFIX[fmt]}", actual=toward(b, a, k, fmt), expected=a,
                     context=label)
        exact, total = exact + int((k == 0).sum()), total + k.size
        if np.any((k > 0) & (a != b)):
            event("an ambiguous element differs by its allowance")
    assert exact >= MODEL_MIN_EXACT * total, f"only {exact} of {total} elements must be exact"


@settings(examples(12))
@given(fmt=FMTS, activation=st.sampled_from(["gelu", "gelu_tanh", "tanh", "relu"]),
       sizes=st.lists(st.integers(1, 12), min_size=2, max_size=5), batch=st.integers(1, 8))
def test_tape_holds_what_torch_saves_under_autocast_module_by_module(
        fmt: str, activation: str, sizes: list[int], batch: int, device: str) -> None:
    """Every module's tape under autocast: the shapes, dtypes (2-byte lp) and bytes torch's
    saved_tensors_hooks see it save; with Dropout on the CPU."""
    dropout = 0.3 if torch.device(device).type == "cpu" else 0.0
    lp_bytes = 0
    for path, mine, theirs in saved_signatures(tuple(sizes), activation, dropout, fmt, batch,
                                               device):
        assert_claim("amp.saved_bytes", actual=theirs, expected=mine, context=f"(module {path!r})")
        lp_bytes += int(mine[mine[:, 6] == 2, 7].sum())
    assert lp_bytes > 0, "nothing 2-byte was saved: the tape is not low precision"


@settings(examples(40))
@given(contexts=st.lists(st.tuples(st.sampled_from([None, "float16", "bfloat16"]),
                                   st.booleans()), min_size=1, max_size=4))
def test_nested_autocast_states_are_torchs_at_every_depth(contexts: list, device: str) -> None:
    """Entering and leaving the same nest of contexts in both trees: the same states."""
    mine, theirs = nested_states(contexts, device)
    event(f"depth {len(contexts)}, innermost enabled {bool(mine[-2, 0])}")
    assert_claim("amp.state", actual=theirs, expected=mine, context=f"{contexts}")


def test_op_lists_match_what_torch_registers_and_does(device: str) -> None:
    """Every listed op is registered for its device's Autocast key (and no other device's list
    is), and every simply callable one gives the list's output dtype on this device."""
    found, checked = amp_lists.mismatches(device)
    assert checked > 100
    assert_claim("amp.op_lists", actual=np.int64(len(found)), expected=np.int64(0),
                 context="; ".join(found))
