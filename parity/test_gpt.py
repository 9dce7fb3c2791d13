"""reference.gpt against torch_impl.gpt, the model itself: the tape's bytes and names, the
state_dict, the boundary, the sdpa path's refusal, the sdpa model's logits against the
reference's, the copy task's batches and learning, the FLOP count. Every op and gradient
within its bound: parity/test_gpt_bounds.py; under autocast: parity/test_gpt_amp.py.

Both models hold the same weights (the reference's, copied): parity/drivers/gpt.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim, assert_observed, expect_broken
from parity.drivers import gpt as dg
from parity.drivers import gpt_learn as gl
from parity.drivers import gpt_pairs as gp
from parity.strategies import examples, gpt_batches, gpt_configs
from reference import data as rdata
from reference import gpt as rgpt
from torch_impl import attention as tattn
from torch_impl import data as tdata
from torch_impl import saved_tensors as tsaved

DTYPES = (np.float32, np.float64)
CPU_DROPOUT = ("CUDA fuses dropout (native_dropout saves a bool mask and rounds the scale "
               "separately): neither the saved bytes nor the replayed mask is the CPU kernel's")


def _skip_dropout_on_cuda(device: str, config: dg.GPTConfig) -> None:
    if device != "cpu" and config.dropout > 0:
        pytest.skip(f"CPU-specific: {CPU_DROPOUT}")


def _bytes_by_op(counts: dict) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for (module, name, _shape, _dtype, nbytes), n in counts.items():
        out[(module, name)] = out.get((module, name), 0) + n * nbytes
    return out


@given(config=gpt_configs(), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(examples(20))
def test_tape_holds_exactly_the_bytes_torchs_hooks_see_per_op_and_in_total(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Every saved tensor (module, node.attr, shape, dtype, bytes) and the distinct storages'
    bytes are the same in both trees, dropout on and off, float32 and float64."""
    _skip_dropout_on_cuda(device, config)
    batch, seq_len, seed = data.draw(gpt_batches(config))
    event("dropout on" if config.dropout else "dropout off")
    event("T == block_size" if seq_len == config.block_size else "T < block_size")
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    ref_counts, ref_held, torch_counts, torch_held = dg.saved_both(config, dtype, idx, targets,
                                                                   device=device)
    assert ref_counts == torch_counts, (
        f"gpt.saved_tensors: reference only {sorted((ref_counts - torch_counts).elements())}, "
        f"torch only {sorted((torch_counts - ref_counts).elements())}")
    ref_ops, torch_ops = _bytes_by_op(ref_counts), _bytes_by_op(torch_counts)
    keys = sorted(set(ref_ops) | set(torch_ops))
    assert_claim("gpt.saved_tensors", actual=np.array([torch_ops.get(k, -1) for k in keys]),
                 expected=np.array([ref_ops.get(k, -1) for k in keys]), context="bytes per op")
    assert_claim("gpt.saved_tensors", actual=np.array([torch_held]), expected=np.array([ref_held]),
                 context="bytes held (distinct storages)")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_measure_saved_tensors_names_every_save_in_its_innermost_module_the_core_included(
        device: str, dropout: float) -> None:
    """torch_impl.saved_tensors.measure_saved_tensors on the transformer lists the reference's tape:
    every save named, in its innermost module -- the attention core's q, k^T, mask, softmax
    and att @ v operands in `attn.core` itself, which runs them in its own forward between
    its children -- parameters flagged, nothing unnamed, and a tensor two nodes save named
    after each in the order they saved it."""
    config = dg.GPTConfig(dropout=dropout)
    _skip_dropout_on_cuda(device, config)
    ref, twin = dg.make_pair(config, np.float32, 0, device)
    idx, targets = dg.tokens(config, 2, config.block_size, 0)
    ref.forward(idx, targets)
    saved = tsaved.measure_saved_tensors(twin, dg.to_torch_tokens(idx, device),
                                         dg.to_torch_tokens(targets, device))
    assert [s for s in saved if s.name == "?"] == []
    activations = [s for s in saved if not s.is_parameter]
    for i in range(config.n_layer):
        core = f"transformer.h.{i}.attn.core"
        theirs = sorted(s.name for s in activations if s.module == core)
        mine = sorted(s.name.split(":")[-1] for s in ref.tape() if s.module == core)
        assert "SoftmaxBackward0.result" in mine and theirs == mine, core
    assert dg.saved_counts(activations) == dg.saved_counts(ref.tape())
    # one tensor, two names: the log-probabilities, log_softmax's result then nll_loss's self
    assert [s.name for s in activations if s.module == ""] == [
        s.name for s in ref.tape() if s.module == ""]


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_state_dict_converts_losslessly_both_ways(device: str, tie: bool, dtype: type) -> None:
    """Every nanoGPT key, lm_head.weight included when tied, keeps its shape, dtype and bits."""
    config = dg.GPTConfig(tie_weights=tie)
    ref = rgpt.GPT(config, rng=np.random.default_rng(3), dtype=dtype)
    back = dg.state_dict_roundtrip(ref, device)
    state = ref.state_dict()
    assert sorted(back) == sorted(state)
    assert ("lm_head.weight" in state) and (len(ref.parameters()) == len(state) - tie)
    for key, value in state.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert_claim("gpt.state_dict_roundtrip", actual=back[key], expected=value, context=key)
    again = rgpt.GPT(config, rng=np.random.default_rng(4), dtype=dtype)
    again.load_state_dict(back)
    for key, value in again.state_dict().items():
        assert_claim("gpt.state_dict_roundtrip", actual=value, expected=state[key],
                     context=f"reloaded {key}")


@pytest.mark.parametrize("case", sorted(dg.bad_inputs(dg.GPTConfig(block_size=6))))
def test_bad_tokens_raise_the_same_error_class_in_both_trees(device: str, case: str) -> None:
    """Each bad input is refused by both trees with the same class, naming GPT."""
    config = dg.GPTConfig(block_size=6)
    idx, targets = dg.bad_inputs(config)[case]
    (ref_cls, ref_msg), (torch_cls, torch_msg) = dg.boundary_errors(config, idx, targets, device)
    assert ref_cls is not None and torch_cls is not None, (case, ref_cls, torch_cls)
    named = ref_msg.startswith("GPT:") and torch_msg.startswith("GPT:")
    assert_observed("gpt.boundary", float(ref_cls is not torch_cls) + float(not named), 1,
                    f"{case}: {ref_cls} vs {torch_cls}; {ref_msg!r} / {torch_msg!r}")


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 64), prefix=st.integers(1, 8),
       vocab=st.integers(3, 40), batch=st.integers(1, 9), stop=st.integers(0, 20))
@settings(examples(30))
def test_copy_task_batches_are_identical_in_both_trees_and_resume_mid_epoch(
        seed: int, n: int, prefix: int, vocab: int, batch: int, stop: int) -> None:
    """The copy task's tokens and the batches read after a mid-epoch resume (a state saved
    by one tree, loaded by the other) are the same bits in both trees."""
    ref_task = rdata.make_copy_task(seed, n, prefix=prefix, vocab_size=vocab)
    torch_task = tdata.make_copy_task(seed, n, prefix=prefix, vocab_size=vocab)
    assert_claim("gpt.copy_task", actual=torch_task.inputs.numpy(), expected=ref_task.inputs,
                 context="inputs")
    assert_claim("gpt.copy_task", actual=torch_task.labels.numpy(), expected=ref_task.labels,
                 context="labels")
    assert np.all(ref_task.labels[:, prefix - 1:] == np.concatenate(
        [np.full((n, 1), vocab - 1), ref_task.inputs[:, :prefix]], 1)), "the copy structure"
    sampler = rdata.ResumableSampler(n, seed)
    for _ in itertools.islice(iter(rdata.make_loader(ref_task, sampler, batch)), stop):
        pass  # the batches a run consumed before it stopped
    event("stopped mid-epoch" if sampler.position else "stopped at an epoch boundary")
    resumed = tdata.ResumableSampler(n, seed)
    resumed.load_state_dict(sampler.state_dict())
    ref_rest = list(rdata.make_loader(ref_task, sampler, batch))
    torch_rest = list(tdata.make_loader(torch_task, resumed, batch, generator=torch.Generator()))
    assert len(ref_rest) == len(torch_rest)
    for (x, y), (tx, ty) in zip(ref_rest, torch_rest, strict=True):
        assert_claim("gpt.copy_task", actual=tx.numpy(), expected=x, context="resumed inputs")
        assert_claim("gpt.copy_task", actual=ty.numpy(), expected=y, context="resumed labels")


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["reference", "torch"])
def test_the_tiny_gpt_learns_the_copy_task_in_both_trees(tree: str) -> None:
    """The stated learning control: held-out copy accuracy >= 95% within CONTROL_STEPS (400)
    AdamW steps, in each tree."""
    curve = gl.learn(tree, gl.CONTROL_STEPS, every=25)
    reached = gl.steps_to(curve)
    assert reached is not None and reached <= gl.CONTROL_STEPS, (tree, curve.accuracy)


@given(config=gpt_configs(dropout=False), data=st.data())
@settings(examples(8))
def test_matmul_list_accounts_for_every_flop_torch_counts(config: dg.GPTConfig,
                                                          data: st.DataObject) -> None:
    """3 x sum 2 b m n k over the reference's matmul list == FlopCounterMode's total."""
    batch, seq_len, seed = data.draw(gpt_batches(config))
    listed = 3 * sum(2 * b * m * n * k for _, _, b, m, n, k in rgpt.matmuls(config, batch,
                                                                            seq_len))
    assert_claim("gpt.flops", actual=np.array([dg.torch_flops(config, batch, seq_len, seed)]),
                 expected=np.array([listed]), context="total FLOPs")


SDPA_CPU = "the budget is the CPU flash kernel's (one block of keys, exp_u20)"


@given(config=gpt_configs(dropout=False), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(examples(15))
def test_sdpa_models_logits_match_the_reference_within_carried_bounds(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """The attention='sdpa' model's every op up to the logits is within gpt.logits' carried
    budget of the reference's explicit model, its cores within the fused kernel's."""
    if device != "cpu":
        pytest.skip(f"CPU-specific: {SDPA_CPU}")
    batch, seq_len, seed = data.draw(gpt_batches(config))
    event("T >= 2: the causal mask decides" if seq_len >= 2 else "T = 1")
    for claim_id, where, ref_value, torch_value, scale in gp.sdpa_carried_pairs(
            config, dtype, batch, seq_len, seed, device):
        assert_claim(claim_id, actual=torch_value, expected=ref_value, context=where,
                     scale=scale)


def test_sdpa_logits_claim_breaks_when_is_causal_is_dropped(
        device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seeded fault: sdpa called without is_causal lets every position attend to the
    future, and gpt.sdpa_logits sees it."""
    if device != "cpu":
        pytest.skip(f"CPU-specific: {SDPA_CPU}")
    fused = tattn.F.scaled_dot_product_attention

    def acausal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                is_causal: bool = False) -> torch.Tensor:
        return fused(q, k, v, dropout_p=dropout_p)

    monkeypatch.setattr(tattn.F, "scaled_dot_product_attention", acausal)
    config = dg.GPTConfig(dropout=0.0)
    with expect_broken("gpt.sdpa_logits"):
        for claim_id, where, ref_value, torch_value, scale in gp.sdpa_carried_pairs(
                config, np.float64, 2, config.block_size, 3, device):
            assert_claim(claim_id, actual=torch_value, expected=ref_value, context=where,
                         scale=scale)


INIT_ALPHA = 1e-6  # gpt.init's bound, its false-failure probability per run


@pytest.mark.parametrize("tie", [False, True])
def test_torch_init_draws_the_reference_init_distribution_per_parameter(
        device: str, tie: bool) -> None:
    """Each normally drawn torch parameter passes a mean and a variance test against the
    (mean, std) the reference's own init drew it with, with power against a 2x std error;
    every constant parameter is bit-identical to the reference's."""
    config = dg.GPTConfig(tie_weights=tie)  # n_layer 2: residual std 0.02 / 2
    tests, constants = dg.torch_init_tests(config, 0, device)
    m = 2 * len(tests)
    for t in tests:  # the reference's rule is nanoGPT's
        residual = t.name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight"))
        assert t.std == (0.02 / math.sqrt(2 * config.n_layer) if residual else 0.02), t
        for ratio in (2.0, 0.5):  # the test could see a 2x std error in this parameter
            assert dg.variance_test_power(t.n, INIT_ALPHA / m, ratio) > 1 - 1e-9, (t, ratio)
    assert {t.name for t in tests} == ({"lm_head.weight"} if not tie else set()) | {
        "transformer.wte.weight", "transformer.wpe.weight"} | {
        f"transformer.h.{i}.{w}.weight" for i in range(config.n_layer)
        for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    p = min(1.0, m * min(min(t.p_mean, t.p_var) for t in tests))
    assert_observed("gpt.init", p, sum(t.n for t in tests), f"(tied={tie})")
    for name, (x, expected) in constants.items():
        assert_claim("gpt.init_constants", actual=x, expected=expected, context=name)
