"""Checkpointing, reference vs torch: bit-identical gradients within each tree, held bytes
predicted from the tape == measured by saved_tensors_hooks, recompute counts per layer,
equal plans, and torch's checkpointed gradients against the reference layers (nn claims).
Then the transformer (parity/drivers/recompute_gpt.py runs both trees): per-block
checkpointing and selective recomputation of the attention core, bit-identical gradients
within each tree (dropout on, float32, float64, autocast) and held bytes equal across."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from common.recompute_plans import split_recompute
from parity.compare import assert_claim
from parity.drivers.nn import linear_scales, torch_layerwise
from parity.drivers.recompute import (
    counts_array,
    dropout_recomputed,
    finished_predicted,
    inputs,
    make_ref,
    make_twin,
    n_layers,
    plan_array,
    predicted_held_bytes,
    ref_case,
    torch_case,
)
from parity.drivers.recompute_gpt import ref_run, torch_run
from parity.strategies import examples, gpt_batches, gpt_configs, recompute_models, recompute_specs
from reference import gpt as rgpt
from reference import nn as ref
from reference import recompute as rrc
from reference.recompute_gpt import RecomputedCore as RefCore
from reference.recompute_gpt import set_recompute as ref_set
from torch_impl import gpt as tgpt
from torch_impl import nn as tnn
from torch_impl import recompute as trc
from torch_impl import state_mapping as tstate
from torch_impl.recompute_gpt import RecomputedCore as TorchCore
from torch_impl.recompute_gpt import set_recompute as torch_set


def test_checkpointed_mlp_holds_and_recomputes_what_torch_checkpoint_does(device: str) -> None:
    """An MLP checkpointed in segments of two: the reference tape's held bytes and per-layer
    recomputes are what torch.utils.checkpoint's saved_tensors_hooks and forward hooks see."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6))  # (batch, d_in) float64
    g = rng.standard_normal((4, 3))  # (batch, d_out)
    ref_model = ref.make_mlp([6, 8, 8, 3], "tanh", rng=rng, dtype=np.float64)  # L A L A L
    torch_model = tnn.make_mlp([6, 8, 8, 3], "tanh", generator=torch.Generator().manual_seed(0),
                               dtype=torch.float64, device=device)
    torch_model.load_state_dict(tstate.state_dict_to_torch(ref_model.state_dict(), device))
    ref_ckpt = rrc.forward_with_schedule(ref_model, x, "uniform:2")
    ref_ckpt.backward(g)
    torch_ckpt = trc.measure(torch_model, torch.from_numpy(x).to(device).requires_grad_(),
                             torch.from_numpy(g).to(device), "uniform:2")
    assert counts_array(ref_ckpt.recomputed()).sum() > 0  # something was recomputed
    assert_claim("recompute.held_bytes", actual=np.array([torch_ckpt.held_bytes]),
                 expected=np.array([predicted_held_bytes(ref_ckpt, device)]))
    assert_claim("recompute.counts", actual=counts_array(torch_ckpt.started),
                 expected=counts_array(ref_ckpt.recomputed()))


@given(case=recompute_models(), data=st.data())
@settings(examples(25))
def test_reference_gradients_under_any_schedule_are_bitwise_plain(case: dict,
                                                                  data: st.DataObject) -> None:
    """Any schedule, dropout on: the reference's gradients and final RNG state are unchanged."""
    spec = data.draw(recompute_specs(n_layers(case)))
    event(spec.partition(":")[0])
    _, base = ref_case(case, "none")
    run, grads = ref_case(case, spec)
    event(f"dropout recomputed: {dropout_recomputed(case, run.recomputed())}")
    for key in base:
        assert_claim("recompute.grads_reference", actual=grads[key], expected=base[key],
                     context=f"({spec}, {key})")


@given(case=recompute_models(), data=st.data())
@settings(examples(15))
def test_torch_gradients_under_any_schedule_are_bitwise_plain(case: dict, data: st.DataObject,
                                                              device: str) -> None:
    """Any schedule with torch.utils.checkpoint on the device: gradients and where the
    device's dropout generator ends are unchanged."""
    spec = data.draw(recompute_specs(n_layers(case)))
    event(spec.partition(":")[0])
    _, base = torch_case(case, "none", device)
    m, grads = torch_case(case, spec, device)
    event(f"dropout recomputed: {dropout_recomputed(case, m.started)}")
    for key in base:
        assert_claim("recompute.grads_torch", actual=grads[key], expected=base[key],
                     context=f"({spec}, {key})")


@given(case=recompute_models(), fmt=st.sampled_from(["bfloat16", "float16"]), data=st.data())
@settings(examples(15))
def test_gradients_under_autocast_and_any_schedule_are_bitwise_plain_in_each_tree(
        case: dict, fmt: str, data: st.DataObject, device: str) -> None:
    """The forward under fp16/bf16 autocast, dropout on: in each tree, any schedule leaves the
    gradients and the dropout stream where no checkpointing leaves them."""
    case = {**case, "dtype": np.float32, "autocast": fmt}
    spec = data.draw(recompute_specs(n_layers(case)))
    event(spec.partition(":")[0])
    _, base = ref_case(case, "none")
    run, grads = ref_case(case, spec)
    event(f"dropout recomputed: {dropout_recomputed(case, run.recomputed())}")
    for key in base:
        assert_claim("recompute.grads_reference", actual=grads[key], expected=base[key],
                     context=f"({fmt}, {spec}, {key})")
    _, base = torch_case(case, "none", device)
    _, grads = torch_case(case, spec, device)
    for key in base:
        assert_claim("recompute.grads_torch", actual=grads[key], expected=base[key],
                     context=f"({fmt}, {spec}, {key})")


@given(case=recompute_models(), fmt=st.sampled_from(["bfloat16", "float16"]), data=st.data())
@settings(examples(15))
def test_held_bytes_under_autocast_predicted_by_the_tape_match_torch(
        case: dict, fmt: str, data: st.DataObject, device: str) -> None:
    """Under fp16/bf16 autocast and any schedule: tape bytes (2-byte lp tensors) ==
    saved_tensors_hooks bytes, and the same layers recompute."""
    case = {**case, "dtype": np.float32, "autocast": fmt}
    spec = data.draw(recompute_specs(n_layers(case)))
    run, _ = ref_case(case, spec)
    m, _ = torch_case(case, spec, device)
    normal = [i for i in run.schedule.plan if isinstance(i, int)]  # layers run normally
    event("a Linear holds its lp input and weight" if any(
        isinstance(run.model[i], ref.Linear) for i in normal) else "every Linear checkpointed")
    assert_claim("recompute.held_bytes", actual=np.array([m.held_bytes]),
                 expected=np.array([predicted_held_bytes(run, device)]), context=f"({fmt}, {spec})")
    assert_claim("recompute.counts", actual=counts_array(m.started),
                 expected=counts_array(run.recomputed()), context=f"({fmt}, {spec})")


@given(case=recompute_models(), data=st.data(), early_stop=st.booleans())
@settings(examples(40))
def test_held_bytes_and_recompute_counts_predicted_by_the_reference_match_torch(
        case: dict, data: st.DataObject, early_stop: bool, device: str) -> None:
    """Tape bytes == saved_tensors_hooks bytes; reference recomputes == torch's started
    forwards; torch's finished forwards == those minus the early-stop interruptions (none
    with early_stop=False, in both trees)."""
    spec = data.draw(recompute_specs(n_layers(case)))
    run, _ = ref_case(case, spec, early_stop=early_stop)
    m, _ = torch_case(case, spec, device, early_stop=early_stop)
    recomputed = counts_array(run.recomputed())
    event("something recomputed" if recomputed.sum() else "nothing recomputed")
    event("a layer interrupted" if counts_array(run.interrupted()).sum() else "none interrupted")
    event("early stop skipped trailing layers" if any(
        node.recomputes and node.last_saving < len(node.layer_indices) - 1
        for node in run.checkpoints) else "no trailing layer skipped")
    assert_claim("recompute.held_bytes", actual=np.array([m.held_bytes]),
                 expected=np.array([predicted_held_bytes(run, device)]), context=f"({spec})")
    assert_claim("recompute.counts", actual=counts_array(m.started), expected=recomputed,
                 context=f"({spec})")
    assert_claim("recompute.early_stop", actual=counts_array(m.finished),
                 expected=finished_predicted(run), context=f"({spec}, early_stop={early_stop})")


@pytest.mark.parametrize("spec", ["uniform:3", "uniform:10", "optimal:2", "sqrt"])
@pytest.mark.parametrize("early_stop", [True, False])
def test_segments_ending_in_layers_that_save_nothing_recompute_alike_in_both_trees(
        spec: str, early_stop: bool, device: str) -> None:
    """Eval-mode Dropouts save nothing: segments ending in one stop early, at a layer or at
    a nested checkpoint's input (optimal:2), in both trees; counts and held bytes agree."""
    case = {"sizes": [4, 6, 6, 6, 3], "activation": "tanh", "dropout": 0.5, "training": False,
            "dtype": np.float64, "batch": 2, "seed": 5}  # L A D L A D L A D L
    run, _ = ref_case(case, spec, early_stop=early_stop)
    m, _ = torch_case(case, spec, device, early_stop=early_stop)
    assert any(node.last_saving < len(node.layer_indices) - 1 for node in run.checkpoints)
    if spec == "optimal:2":  # a nested checkpoint is some segment's last saving child
        assert any(node.last_saving >= 0 and node.last_saving_layer is None
                   for node in run.checkpoints)
    assert_claim("recompute.held_bytes", actual=np.array([m.held_bytes]),
                 expected=np.array([predicted_held_bytes(run, device)]), context=f"({spec})")
    assert_claim("recompute.counts", actual=counts_array(m.started),
                 expected=counts_array(run.recomputed()), context=f"({spec})")
    assert_claim("recompute.early_stop", actual=counts_array(m.finished),
                 expected=finished_predicted(run), context=f"({spec}, early_stop={early_stop})")


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
def test_plans_are_equal_in_both_trees_and_revolve_meets_the_closed_form() -> None:
    """parse_schedule agrees across trees for n <= 64; optimal:S costs r n - beta(S+1, r-1)."""
    for n in range(1, 65):
        specs = ["none", "sqrt", *(f"uniform:{k}" for k in range(1, n + 1)),
                 *(f"optimal:{s}" for s in range(1, 9))]
        for spec in specs:
            a = plan_array(rrc.parse_schedule(spec, n).plan)
            b = plan_array(trc.parse_schedule(spec, n).plan)
            assert a.shape == b.shape, spec
            assert_claim("recompute.plans", actual=b, expected=a, context=f"({spec}, n = {n})")
        for s in range(1, 9):
            assert_claim("recompute.plans", actual=np.array([rrc.revolve_cost(n, s)]),
                         expected=np.array([rrc.binomial_cost(n, s)]),
                         context=f"(optimal:{s}, n = {n})")


@given(case=recompute_models(), data=st.data())
@settings(examples(15))
def test_torch_checkpointed_gradients_meet_the_nn_claims_against_reference_layers(
        case: dict, data: st.DataObject) -> None:
    """torch's checkpointed parameter gradients equal its plain layer-by-layer run's bits, and
    each reference Linear fed that run's activation and gradient meets nn.linear for them.

    CPU only: the layer-by-layer run (parity.drivers.nn) reads CPU Dropout's saved noise, and
    the nn claims' CUDA coverage belongs to the nn topic."""
    spec = data.draw(recompute_specs(n_layers(case)))
    _, tgrads = torch_case(case, spec)
    x, g = inputs(case)
    with torch.random.fork_rng():
        torch.manual_seed(case["seed"])
        plain = make_twin(case)
        acts, _ = torch_layerwise(plain, x, g)
    model = make_ref(case)
    for i, layer in enumerate(model):
        if not isinstance(layer, ref.Linear):
            continue
        xi, gi = acts[i].detach().numpy(), acts[i + 1].grad.numpy()
        layer.zero_grad()
        layer.forward(xi)
        layer.backward(gi)
        scales = linear_scales(layer, xi, gi)
        for name in ("weight", "bias"):
            torch_grad = tgrads[f"{i}.{name}"]
            assert_claim("recompute.grads_torch", actual=torch_grad,
                         expected=getattr(plain[i], name).grad.numpy(),
                         context=f"({spec}, layerwise)")
            assert_claim("nn.linear", actual=torch_grad, expected=getattr(layer, name).grad,
                         context=f"({spec}, {i}.{name})", scale=scales[name])


# ---------------------------------------------------------------- the transformer


@st.composite
def gpt_specs(draw: st.DrawFn, n_layer: int) -> str:
    """A block schedule over n_layer blocks, "selective", or the two joined; never "none"
    alone (that would compare no recomputation with itself)."""
    blocks = draw(recompute_specs(n_layer))
    if blocks != "none" and not draw(st.booleans()):
        return blocks
    return "selective" if blocks == "none" else f"{blocks}+selective"


@st.composite
def gpt_steps(draw: st.DrawFn, config: rgpt.GPTConfig) -> tuple[int, int, int]:
    """(batch, seq_len, seed) with T >= 2 where the block size allows: a real T x T core."""
    batch, _, seed = draw(gpt_batches(config))
    return batch, draw(st.integers(min(2, config.block_size), config.block_size)), seed


def _events(spec: str, config: rgpt.GPTConfig, seq_len: int) -> None:
    blocks, selective = split_recompute(spec)
    event(blocks.split(":")[0] + (" + selective" if selective else ""))
    event("dropout on" if config.dropout else "dropout off")
    event("a T x T core (T > 1)" if seq_len > 1 else "T = 1")


def _same(claim_id: str, run: object, base: object, context: str) -> None:
    assert_claim(claim_id, actual=run.loss, expected=base.loss, context=f"{context} loss")
    assert sorted(run.grads) == sorted(base.grads)
    for key in base.grads:
        assert_claim(claim_id, actual=run.grads[key], expected=base.grads[key],
                     context=f"{context} {key}")


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@given(config=gpt_configs(max_layers=4, dropout=True), dtype=st.sampled_from([np.float32,
                                                                              np.float64]),
       data=st.data())
@settings(examples(20))
def test_reference_gpt_gradients_under_any_recompute_are_bitwise_plain(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Any block schedule, selective or both, dropout on: loss, gradients and the dropout
    stream's end are those of no recomputation, bit for bit."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_steps(config))
    _events(spec, config, seq_len)
    base = ref_run(config, "none", dtype, batch, seq_len, seed)
    run = ref_run(config, spec, dtype, batch, seq_len, seed)
    _same("recompute.gpt_grads_reference", run, base, f"({spec}, {np.dtype(dtype)})")


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@given(config=gpt_configs(max_layers=4, dropout=True), dtype=st.sampled_from([np.float32,
                                                                              np.float64]),
       data=st.data())
@settings(examples(15))
def test_torch_gpt_gradients_under_any_recompute_are_bitwise_plain(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject, device: str) -> None:
    """torch.utils.checkpoint per block and around the core, dropout on: the same bits."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_steps(config))
    _events(spec, config, seq_len)
    base = torch_run(config, "none", dtype, batch, seq_len, seed, device)
    run = torch_run(config, spec, dtype, batch, seq_len, seed, device)
    _same("recompute.gpt_grads_torch", run, base, f"({spec}, {np.dtype(dtype)})")


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@given(config=gpt_configs(max_layers=3, dropout=True),
       fmt=st.sampled_from(["bfloat16", "float16"]), data=st.data())
@settings(examples(10))
def test_gpt_gradients_under_autocast_and_any_recompute_are_bitwise_plain_in_each_tree(
        config: rgpt.GPTConfig, fmt: str, data: st.DataObject, device: str) -> None:
    """The forward under fp16/bf16 autocast, dropout on: in each tree, recomputation leaves
    loss, gradients and dropout stream where no recomputation leaves them."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_steps(config))
    _events(spec, config, seq_len)
    args = (config, np.float32, batch, seq_len, seed)
    _same("recompute.gpt_grads_reference", ref_run(*args[:1], spec, *args[1:], autocast=fmt),
          ref_run(*args[:1], "none", *args[1:], autocast=fmt), f"({fmt}, {spec})")
    _same("recompute.gpt_grads_torch",
          torch_run(*args[:1], spec, *args[1:], device, autocast=fmt),
          torch_run(*args[:1], "none", *args[1:], device, autocast=fmt), f"({fmt}, {spec})")


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@given(config=gpt_configs(max_layers=4), dtype=st.sampled_from([np.float32, np.float64]),
       data=st.data())
@settings(examples(20))
def test_gpt_held_bytes_read_off_the_tape_match_torch_hooks_under_any_recompute(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject, device: str) -> None:
    """Block schedules, selective and both: the reference tape's distinct bytes == the
    storages torch's saved_tensors_hooks see packed (parameters excluded)."""
    if device != "cpu" and config.dropout > 0:
        config = rgpt.GPTConfig(**{**config.__dict__, "dropout": 0.0})  # gpt.saved_tensors
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_steps(config))
    _events(spec, config, seq_len)
    ref = ref_run(config, spec, dtype, batch, seq_len, seed)
    twin = torch_run(config, spec, dtype, batch, seq_len, seed, device)
    base = ref_run(config, "none", dtype, batch, seq_len, seed)
    event("recompute holds less" if ref.held_bytes < base.held_bytes else "holds as much")
    assert_claim("recompute.gpt_held_bytes", actual=np.array([twin.held_bytes]),
                 expected=np.array([ref.held_bytes]), context=f"({spec}, {np.dtype(dtype)})")


def test_selective_recompute_keeps_one_qkv_buffer_instead_of_the_t_by_t_tensors() -> None:
    """Selective held bytes, derived by hand for one block: none's tape minus the core's own
    saves (q, k^T, v copies, the causal mask, p, dropout's noise, p after dropout) plus the
    qkv buffer (B, T, 3C); the same in both trees (the claim's mechanism, as arithmetic)."""
    config = rgpt.GPTConfig(n_layer=1, dropout=0.1)
    B, T = 2, config.block_size
    C, nh = config.n_embd, config.n_head
    core = 3 * B * T * C * 4 + T * T + 3 * B * nh * T * T * 4  # q3 kt3 v3; mask; p noise p_drop
    expected = ref_run(config, "none", np.float32, B, T, 3).held_bytes - core + B * T * 3 * C * 4
    assert ref_run(config, "selective", np.float32, B, T, 3).held_bytes == expected
    assert torch_run(config, "selective", np.float32, B, T, 3).held_bytes == expected


def test_set_recompute_swaps_cores_in_place_and_back_keeping_every_name() -> None:
    """Selective swaps each core for its recomputed twin under the same name (parameters,
    state_dict and module paths unchanged), and "none" swaps it back."""
    config = rgpt.GPTConfig(n_layer=2)
    ref = rgpt.GPT(config, rng=np.random.default_rng(0))
    twin = tgpt.GPT(config, generator=torch.Generator().manual_seed(0))
    names = ([n for n, _ in ref.named_modules()], [n for n, _ in twin.named_modules()],
             sorted(twin.state_dict()))
    ref_set(ref, "optimal:1+selective")
    torch_set(twin, "optimal:1+selective")
    assert all(isinstance(b.attn.core, RefCore) for b in ref.transformer.h.children())
    assert all(isinstance(b.attn.core, TorchCore) for b in twin.transformer.h)
    assert ref.schedule is not None and twin.schedule == ref.schedule
    assert names == ([n for n, _ in ref.named_modules()], [n for n, _ in twin.named_modules()],
                     sorted(twin.state_dict()))
    ref_set(ref, "none")
    torch_set(twin, "none")
    assert not any(isinstance(b.attn.core, RefCore) for b in ref.transformer.h.children())
    assert not any(isinstance(b.attn.core, TorchCore) for b in twin.transformer.h)
    assert ref.schedule is None and twin.schedule is None


@pytest.mark.parametrize(("spec", "phrase"), [
    ("selective+selective", "expected SPEC, 'selective' or 'SPEC+selective'"),
    ("sqrt+uniform:2", "expected SPEC, 'selective' or 'SPEC+selective'"),
    ("uniform:3", "uniform:K needs 1 <= K <= 2"),
    ("optimal:0+selective", "optimal:S needs S >= 1"),
    ("bogus", "unknown schedule 'bogus'"),
])
def test_a_bad_gpt_recompute_spec_is_refused_alike_in_both_trees(spec: str, phrase: str) -> None:
    config = rgpt.GPTConfig(n_layer=2)
    with pytest.raises(ValueError, match=phrase.replace("+", r"\+")):
        ref_set(rgpt.GPT(config, rng=np.random.default_rng(0)), spec)
    with pytest.raises(ValueError, match=phrase.replace("+", r"\+")):
        torch_set(tgpt.GPT(config, generator=torch.Generator().manual_seed(0)), spec)
