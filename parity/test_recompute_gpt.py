"""Recomputation on the transformer: per-block checkpointing and selective recomputation of
the attention core give bit-identical gradients (dropout on) within each tree, in float32,
float64 and under autocast, and the held bytes read off the reference's tape equal what
torch's saved_tensors_hooks see (parity/drivers/recompute_gpt.py runs both trees)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.recompute_gpt import ref_run, torch_run
from parity.strategies import gpt_batches, gpt_configs, recompute_specs
from reference import gpt as rgpt
from reference.recompute_gpt import RecomputedCore as RefCore
from reference.recompute_gpt import set_recompute as ref_set
from torch_impl import gpt as tgpt
from torch_impl.recompute_gpt import RecomputedCore as TorchCore
from torch_impl.recompute_gpt import set_recompute as torch_set


@pytest.fixture(autouse=True)
def _torch_one_thread() -> None:
    torch.set_num_threads(1)


@st.composite
def gpt_specs(draw: st.DrawFn, n_layer: int) -> str:
    """A block schedule over n_layer blocks, "selective", or the two joined."""
    blocks = draw(recompute_specs(n_layer))
    selective = draw(st.booleans())
    if not selective:
        return blocks
    return "selective" if blocks == "none" else f"{blocks}+selective"


def _events(spec: str, config: rgpt.GPTConfig, seq_len: int) -> None:
    event(spec.replace("uniform:", "uniform").split(":")[0])
    event("dropout on" if config.dropout else "dropout off")
    event("a T x T core (T > 1)" if seq_len > 1 else "T = 1")


def _same(claim_id: str, run: object, base: object, context: str) -> None:
    assert_claim(claim_id, run.loss, base.loss, f"{context} loss")
    assert sorted(run.grads) == sorted(base.grads)
    for key in base.grads:
        assert_claim(claim_id, run.grads[key], base.grads[key], f"{context} {key}")


@given(config=gpt_configs(max_layers=4, dropout=True), dtype=st.sampled_from([np.float32,
                                                                              np.float64]),
       data=st.data())
@settings(max_examples=20)
def test_reference_gpt_gradients_under_any_recompute_are_bitwise_plain(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Any block schedule, selective or both, dropout on: loss, gradients and the dropout
    stream's end are those of no recomputation, bit for bit."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_batches(config))
    _events(spec, config, seq_len)
    base = ref_run(config, "none", dtype, batch, seq_len, seed)
    run = ref_run(config, spec, dtype, batch, seq_len, seed)
    _same("recompute.gpt_grads_reference", run, base, f"({spec}, {np.dtype(dtype)})")


@given(config=gpt_configs(max_layers=4, dropout=True), dtype=st.sampled_from([np.float32,
                                                                              np.float64]),
       data=st.data())
@settings(max_examples=15)
def test_torch_gpt_gradients_under_any_recompute_are_bitwise_plain(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject, device: str) -> None:
    """torch.utils.checkpoint per block and around the core, dropout on: the same bits."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_batches(config))
    _events(spec, config, seq_len)
    base = torch_run(config, "none", dtype, batch, seq_len, seed, device)
    run = torch_run(config, spec, dtype, batch, seq_len, seed, device)
    _same("recompute.gpt_grads_torch", run, base, f"({spec}, {np.dtype(dtype)})")


@given(config=gpt_configs(max_layers=3, dropout=True),
       fmt=st.sampled_from(["bfloat16", "float16"]), data=st.data())
@settings(max_examples=10)
def test_gpt_gradients_under_autocast_and_any_recompute_are_bitwise_plain_in_each_tree(
        config: rgpt.GPTConfig, fmt: str, data: st.DataObject, device: str) -> None:
    """The forward under fp16/bf16 autocast, dropout on: in each tree, recomputation leaves
    loss, gradients and dropout stream where no recomputation leaves them."""
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_batches(config))
    _events(spec, config, seq_len)
    args = (config, np.float32, batch, seq_len, seed)
    _same("recompute.gpt_grads_reference", ref_run(*args[:1], spec, *args[1:], autocast=fmt),
          ref_run(*args[:1], "none", *args[1:], autocast=fmt), f"({fmt}, {spec})")
    _same("recompute.gpt_grads_torch",
          torch_run(*args[:1], spec, *args[1:], device, autocast=fmt),
          torch_run(*args[:1], "none", *args[1:], device, autocast=fmt), f"({fmt}, {spec})")


@given(config=gpt_configs(max_layers=4), dtype=st.sampled_from([np.float32, np.float64]),
       data=st.data())
@settings(max_examples=20)
def test_gpt_held_bytes_read_off_the_tape_match_torch_hooks_under_any_recompute(
        config: rgpt.GPTConfig, dtype: type, data: st.DataObject, device: str) -> None:
    """Block schedules, selective and both: the reference tape's distinct bytes == the
    storages torch's saved_tensors_hooks see packed (parameters excluded)."""
    if device != "cpu" and config.dropout > 0:
        config = rgpt.GPTConfig(**{**config.__dict__, "dropout": 0.0})  # gpt.saved_tensors
    spec = data.draw(gpt_specs(config.n_layer))
    batch, seq_len, seed = data.draw(gpt_batches(config))
    _events(spec, config, seq_len)
    ref = ref_run(config, spec, dtype, batch, seq_len, seed)
    twin = torch_run(config, spec, dtype, batch, seq_len, seed, device)
    base = ref_run(config, "none", dtype, batch, seq_len, seed)
    event("recompute holds less" if ref.held_bytes < base.held_bytes else "holds as much")
    assert_claim("recompute.gpt_held_bytes", np.array([ref.held_bytes]),
                 np.array([twin.held_bytes]), f"({spec}, {np.dtype(dtype)})")


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
    assert all(isinstance(b.attn.core, RefCore) for b in ref.transformer.h._children.values())
    assert all(isinstance(b.attn.core, TorchCore) for b in twin.transformer.h)
    assert ref.schedule is not None and twin.schedule == ref.schedule
    assert names == ([n for n, _ in ref.named_modules()], [n for n, _ in twin.named_modules()],
                     sorted(twin.state_dict()))
    ref_set(ref, "none")
    torch_set(twin, "none")
    assert not any(isinstance(b.attn.core, RefCore) for b in ref.transformer.h._children.values())
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
