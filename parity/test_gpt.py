"""reference.gpt against torch_impl.gpt: the tape's bytes, the state_dict, the boundary, every
op and every parameter gradient, the logits along a whole run, and the sdpa path.

Both models hold the same weights (the reference's, copied); torch's dropout masks are read
from what its backward saved and replayed into the reference (parity/drivers/gpt.py). The
eps claims' scales are computed by parity/drivers/gpt_bounds.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import gpt as dg
from parity.drivers import gpt_bounds as gb
from parity.drivers.nn import ce_scales, linear_scales, run_ref
from parity.strategies import gpt_batches, gpt_configs
from parity.tolerances import claim
from reference import gpt as rgpt
from reference import nn as rnn
from reference.layers import Embedding, LayerNorm

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
@settings(max_examples=25)
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
    assert_claim("gpt.saved_tensors", np.array([ref_ops.get(k, -1) for k in keys]),
                 np.array([torch_ops.get(k, -1) for k in keys]), "bytes per op")
    assert_claim("gpt.saved_tensors", np.array([ref_held]), np.array([torch_held]),
                 "bytes held (distinct storages)")


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
        assert_claim("gpt.state_dict_roundtrip", back[key], value, key)
    again = rgpt.GPT(config, rng=np.random.default_rng(4), dtype=dtype)
    again.load_state_dict(back)
    for key, value in again.state_dict().items():
        assert_claim("gpt.state_dict_roundtrip", value, state[key], f"reloaded {key}")


@pytest.mark.parametrize("case", sorted(dg.bad_inputs(dg.GPTConfig(block_size=6))))
def test_bad_tokens_raise_the_same_error_class_in_both_trees(device: str, case: str) -> None:
    """Each bad input is refused by both trees with the same class, naming GPT."""
    config = dg.GPTConfig(block_size=6)
    idx, targets = dg.bad_inputs(config)[case]
    (ref_cls, ref_msg), (torch_cls, torch_msg) = dg.boundary_errors(config, idx, targets, device)
    assert ref_cls is not None and torch_cls is not None, (case, ref_cls, torch_cls)
    assert ref_cls is torch_cls, f"gpt.boundary: {case}: {ref_cls} vs {torch_cls}"
    assert ref_msg.startswith("GPT:") and torch_msg.startswith("GPT:"), (ref_msg, torch_msg)


def test_the_reference_refuses_sdpa_and_torch_runs_it(device: str) -> None:
    """attention='sdpa' is torch's fused kernel: the reference says so instead of pretending."""
    config = dg.GPTConfig(attention="sdpa")
    with pytest.raises(ValueError, match="sdpa"):
        rgpt.GPT(config, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="attention"):
        dg.GPTConfig(attention="flash")


def _check_module(path: str, module: rnn.Module, captured: tuple, noise: np.ndarray | None,
                  run: dg.TorchRun, compared: set[str]) -> None:
    """Run one reference module on torch's inputs and incoming gradient; hold its output,
    input gradients and parameter gradients to their claims."""
    ins, t_out, t_gins, g = captured
    where = f"{path} ({ins[0].dtype})"
    if isinstance(module, Embedding):
        module.zero_grad()
        assert_claim("gpt.embedding", module.forward(ins[0]), t_out, f"{where} y")
        module.backward(g)
        assert_claim("gpt.embedding", module.weight.grad, run.grads[path + ".weight"],
                     f"{where} dW")
        compared.add(path + ".weight")
    elif isinstance(module, LayerNorm):
        module.zero_grad()
        y = module.forward(ins[0])
        dx = module.backward(g)
        assert_claim("gpt.layer_norm.forward", y, t_out, f"{where} y",
                     scale=gb.layer_norm_forward_scale(ins[0], module.weight.data,
                                                       module.bias.data))
        s_dx, s_dw, _ = gb.layer_norm_backward_scales(ins[0], module.weight.data, g)
        assert_claim("gpt.layer_norm.backward", dx, t_gins[0], f"{where} dx", scale=s_dx)
        assert_claim("gpt.layer_norm.backward", module.weight.grad, run.grads[path + ".weight"],
                     f"{where} dw", scale=s_dw)
        assert_claim("gpt.layer_norm.bias_grad", module.bias.grad, run.grads[path + ".bias"],
                     f"{where} db")
        compared.update({path + ".weight", path + ".bias"})
    elif isinstance(module, rgpt.AttentionCore):
        y = module.forward(*ins)
        grads = module.backward(g)
        s_y, _ = gb.attention_forward_scale(*ins, noise)
        assert_claim("gpt.attention.forward", y, t_out, f"{where} y", scale=s_y)
        for name, d, td, s in zip("qkv", grads, t_gins, gb.attention_backward_scales(
                *ins, noise, g), strict=True):
            assert_claim("gpt.attention.backward", d, td, f"{where} d{name}", scale=s)
    elif isinstance(module, rnn.Linear):
        y, dx, grads = run_ref(module, ins[0], g)
        s = linear_scales(module, ins[0], g)
        assert_claim("nn.linear", y, t_out, f"{where} y", scale=s["y"])
        assert_claim("nn.linear", dx, t_gins[0], f"{where} dx", scale=s["dx"])
        for key, grad in grads.items():
            assert_claim("nn.linear", grad, run.grads[f"{path}.{key}"], f"{where} {key}",
                         scale=s[key])
            compared.add(f"{path}.{key}")
    else:  # GELU
        y, dx, _ = run_ref(module, ins[0], g)
        ax, ag = np.abs(ins[0].astype(np.float64)), np.abs(g.astype(np.float64))
        assert_claim("nn.gelu.forward", y, t_out, f"{where} y", scale=ax)
        assert_claim("nn.gelu.backward", dx, t_gins[0], f"{where} dx",
                     scale=ag * (1.0 + ax * (1.0 + ax * ax)))


@given(config=gpt_configs(), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(max_examples=20)
def test_every_op_and_every_parameter_gradient_within_its_claim(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Each op fed torch's own inputs and incoming gradient (so one op's difference does not
    hide in another's) matches torch within its claim; every parameter's gradient is held."""
    if device != "cpu":
        pytest.skip("CPU-specific: embedding's gradient order, the GELU erf kernel, dropout")
    config = dataclasses.replace(config, tie_weights=False)
    batch, seq_len, seed = data.draw(gpt_batches(config))
    event("dropout on" if config.dropout else "dropout off")
    ref, twin = dg.make_pair(config, dtype, seed % 1000)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    run = dg.run_torch(twin, idx, targets, layerwise=True)
    modules = dict(ref.named_modules())
    compared: set[str] = set()
    for path, captured in run.layers.items():
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None
        if keep is not None:
            dg.replay_masks(modules[path], {"attn_dropout": keep})
            noise = keep.astype(dtype) / dtype(1 - config.dropout)
        _check_module(path, modules[path], captured, noise, run, compared)
    assert compared == {name for name, _ in ref.named_parameters()}


@given(config=gpt_configs(max_layers=3), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(max_examples=20)
def test_logits_and_loss_along_a_whole_run_within_carried_bounds(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Along one end-to-end forward, every op's output difference (up to the logits) is
    within its own budget plus its inputs' measured differences carried through |J|, and
    the loss within nn.cross_entropy's plus the logits' carried."""
    _skip_dropout_on_cuda(device, config)
    batch, seq_len, seed = data.draw(gpt_batches(config))
    event("tied" if config.tie_weights else "untied")
    ref, twin = dg.make_pair(config, dtype, seed % 1000, device)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    run = dg.run_torch(twin, idx, targets, device=device, layerwise=True)
    seen = dg.record_ref(ref, idx, targets, run.keeps)
    modules = dict(ref.named_modules())
    gelu = float(claim("nn.gelu.forward").bound)  # type: ignore[arg-type]
    for path, (ins, out) in seen.items():
        t_ins, t_out = run.layers[path][0], run.layers[path][1]
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None if keep is None else keep.astype(dtype) / dtype(1 - config.dropout)
        assert_claim("gpt.logits", out, t_out, path,
                     scale=dg.carried_scale(modules[path], ins, t_ins, noise, gelu))
    logits, loss = dg.run_ref(ref, idx, targets, run.keeps)[:2]
    flat, t_flat = logits.reshape(-1, config.vocab_size), run.logits.reshape(-1, config.vocab_size)
    eps = float(np.finfo(dtype).eps)
    e = np.abs(flat.astype(np.float64) - t_flat.astype(np.float64)) / eps
    t_flat64 = t_flat.astype(np.float64)
    p = np.exp(t_flat64 - t_flat64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rows = np.take_along_axis(e, targets.reshape(-1, 1), 1)[:, 0] + (p * e).sum(-1)
    s_loss = ce_scales("mean", t_flat, targets.reshape(-1), np.asarray(1.0, dtype),
                       np.zeros_like(t_flat))[0]
    assert_claim("gpt.loss", loss, run.loss, "loss", scale=s_loss + rows.mean())


@given(config=gpt_configs(dropout=False), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(max_examples=15)
def test_sdpa_core_matches_the_explicit_core_within_the_attention_budget(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """torch's fused scaled_dot_product_attention, given the explicit path's q, k, v, is
    within gpt.attention.forward's budget of the explicit path's output."""
    batch, seq_len, seed = data.draw(gpt_batches(config))
    _, twin = dg.make_pair(config, dtype, seed % 1000, device)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    run = dg.run_torch(twin, idx, targets, device=device, layerwise=True)
    for path, (ins, out, _, _) in run.layers.items():
        if path.endswith(".core"):
            q, k, v = (torch.from_numpy(a).to(device) for a in ins)
            fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert_claim("gpt.sdpa", fused.cpu().numpy(), out, path,
                         scale=gb.attention_forward_scale(*ins, None)[0])
