"""reference.gpt against torch_impl.gpt: the tape's bytes, the state_dict, the boundary, every
op and every parameter gradient, the logits along a whole run, the sdpa path, and under
autocast the tape and every Linear, LayerNorm and embedding.

Both models hold the same weights (the reference's, copied); torch's dropout masks are read
from what its backward saved and replayed into the reference (parity/drivers/gpt.py). The
eps claims' scales are computed by parity/drivers/gpt_bounds.py.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import gpt as dg
from parity.drivers import gpt_amp as ga
from parity.drivers import gpt_bounds as gb
from parity.drivers import gpt_learn as gl
from parity.drivers import gpt_pairs as gp
from parity.drivers.amp import toward
from parity.strategies import gpt_batches, gpt_configs
from reference import amp as ramp
from reference import data as rdata
from reference import gpt as rgpt
from torch_impl import data as tdata
from torch_impl import module as tmodule

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
@settings(max_examples=20)
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


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_measure_saved_tensors_names_every_save_in_its_innermost_module_the_core_included(
        device: str, dropout: float) -> None:
    """torch_impl.module.measure_saved_tensors on the transformer lists the reference's tape:
    every save named, in its innermost module -- the attention core's q, k^T, mask, softmax
    and att @ v operands in `attn.core` itself, which runs them in its own forward between
    its children -- parameters flagged, nothing unnamed, and a tensor two nodes save named
    after each in the order they saved it."""
    config = dg.GPTConfig(dropout=dropout)
    _skip_dropout_on_cuda(device, config)
    ref, twin = dg.make_pair(config, np.float32, 0, device)
    idx, targets = dg.tokens(config, 2, config.block_size, 0)
    ref.forward(idx, targets)
    saved = tmodule.measure_saved_tensors(twin, dg.to_torch_tokens(idx, device),
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
    pairs, compared, names = gp.layerwise_pairs(config, dtype, batch, seq_len, seed)
    for claim_id, where, actual, expected, scale in pairs:
        assert_claim(claim_id, actual, expected, where, scale=scale)
    target(_worst_ratio(pairs, "gpt.layer_norm.backward", " dw"), label="LayerNorm dw / bound")
    assert compared == names


def _worst_ratio(pairs: list, claim_id: str, where: str = "") -> float:
    """max |a - b| / (eps S) over the pairs of one claim (and `where` suffix): how near the
    bound a drawn example came, for hypothesis' target."""
    worst = 0.0
    for cid, w, a, b, s in pairs:
        if cid == claim_id and w.endswith(where):
            eps = float(np.finfo(np.asarray(b).dtype).eps)
            d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            worst = max(worst, float((d / (eps * np.asarray(s) + 1e-300)).max()))
    return worst


@pytest.mark.parametrize("columns", [1, 3])
def test_layer_norm_bias_grad_adds_rows_in_torchs_order_even_with_one_column(
        device: str, columns: int) -> None:
    """With one column the rows are contiguous and NumPy's plain sum turns pairwise (an ulp
    apart from torch, found by hypothesis at n_embd=1); the reference adds row by row."""
    from reference.layers import layer_norm, layer_norm_backward

    if device != "cpu":
        pytest.skip("CPU-specific: torch's CPU LayerNorm backward adds dbeta row by row")
    rng = np.random.default_rng(columns)
    for rows in (7, 8, 9, 64, 129, 300):
        x = rng.standard_normal((rows, columns)).astype(np.float32)
        g = rng.standard_normal((rows, columns)).astype(np.float32)
        w = np.ones(columns, np.float32)
        _, mean, rstd = layer_norm(x, w, np.zeros(columns, np.float32), 1e-5)
        db = layer_norm_backward(g, x, mean, rstd, w)[2]
        tw = torch.ones(columns, requires_grad=True)
        tb = torch.zeros(columns, requires_grad=True)
        torch.nn.functional.layer_norm(torch.tensor(x), (columns,), tw, tb, 1e-5).backward(
            torch.tensor(g))
        assert_claim("gpt.layer_norm.bias_grad", db, tb.grad.numpy(), f"{rows} x {columns}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_reduction_orders_reproduce_numpy_and_torch_bit_for_bit(device: str,
                                                                     dtype: type) -> None:
    """gpt.loss counts each term's additions in NumPy's pairwise order and torch's CPU nll_loss
    cascade (NOTE [ Row-order sums ]): the emulations must give the libraries' sums exactly,
    for sizes across the block edges (8, 128, 16-term cascade levels), strided as in the loss."""
    if device != "cpu":
        pytest.skip("CPU-specific: torch's CPU nll_loss cascade")
    rng = np.random.default_rng(5)
    sizes = (1, 7, 8, 9, 16, 17, 64, 127, 128, 129, 256, 257, 300, 1000)
    seq_differs = 0
    for n in sizes:
        v = (rng.random(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(dtype)
        logp = np.zeros((n, 3), dtype)
        logp[:, 1] = -v
        strided = -logp[:, 1]  # a strided column, like the loss's take_along_axis
        assert gb.numpy_sum_order(v)[0] == strided.sum(dtype=dtype), f"numpy, N={n}"
        t = torch.nn.functional.nll_loss(torch.from_numpy(logp), torch.ones(n, dtype=torch.long),
                                         reduction="sum").item()
        assert gb.torch_nll_sum_order(v)[0] == dtype(t), f"torch, N={n}"
        seq_differs += int(np.cumsum(v)[-1] != dtype(t))
    assert seq_differs > 0, "no size told the cascade from a plain running sum"


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
    pairs = gp.carried_pairs(config, dtype, batch, seq_len, seed, device)
    for claim_id, where, actual, expected, scale in pairs:
        assert_claim(claim_id, actual, expected, where, scale=scale)
    target(_worst_ratio(pairs, "gpt.loss"), label="loss / bound")


@given(config=gpt_configs(max_layers=3), dtype=st.sampled_from(DTYPES), data=st.data())
@settings(max_examples=15)
def test_every_parameter_gradient_along_a_whole_run_within_carried_bounds(
        device: str, config: dg.GPTConfig, dtype: type, data: st.DataObject) -> None:
    """Along one end-to-end forward and backward, every parameter gradient is within its own
    budget plus its module's measured input and incoming-gradient differences carried."""
    _skip_dropout_on_cuda(device, config)
    config = dataclasses.replace(config, tie_weights=False)
    batch, seq_len, seed = data.draw(gpt_batches(config))
    pairs, compared, names = gp.grad_pairs(config, dtype, batch, seq_len, seed, device)
    for claim_id, where, actual, expected, scale in pairs:
        assert_claim(claim_id, actual, expected, where, scale=scale)
    assert compared == names


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


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 64), prefix=st.integers(1, 8),
       vocab=st.integers(3, 40), batch=st.integers(1, 9), stop=st.integers(0, 20))
@settings(max_examples=30)
def test_copy_task_batches_are_identical_in_both_trees_and_resume_mid_epoch(
        seed: int, n: int, prefix: int, vocab: int, batch: int, stop: int) -> None:
    """The copy task's tokens and the batches read after a mid-epoch resume (a state saved
    by one tree, loaded by the other) are the same bits in both trees."""
    ref_task = rdata.make_copy_task(seed, n, prefix=prefix, vocab_size=vocab)
    torch_task = tdata.make_copy_task(seed, n, prefix=prefix, vocab_size=vocab)
    assert_claim("gpt.copy_task", ref_task.inputs, torch_task.inputs.numpy(), "inputs")
    assert_claim("gpt.copy_task", ref_task.labels, torch_task.labels.numpy(), "labels")
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
        assert_claim("gpt.copy_task", x, tx.numpy(), "resumed inputs")
        assert_claim("gpt.copy_task", y, ty.numpy(), "resumed labels")


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["reference", "torch"])
def test_the_tiny_gpt_learns_the_copy_task_in_both_trees(tree: str) -> None:
    """The stated learning control: held-out copy accuracy >= 95% within CONTROL_STEPS (400)
    AdamW steps, in each tree."""
    curve = gl.learn(tree, gl.CONTROL_STEPS, every=25)
    reached = gl.steps_to(curve)
    assert reached is not None and reached <= gl.CONTROL_STEPS, (tree, curve.accuracy)


@given(config=gpt_configs(dropout=False), data=st.data())
@settings(max_examples=8)
def test_matmul_list_accounts_for_every_flop_torch_counts(config: dg.GPTConfig,
                                                          data: st.DataObject) -> None:
    """3 x sum 2 b m n k over the reference's matmul list == FlopCounterMode's total."""
    batch, seq_len, seed = data.draw(gpt_batches(config))
    listed = 3 * sum(2 * b * m * n * k for _, _, b, m, n, k in rgpt.matmuls(config, batch,
                                                                            seq_len))
    assert_claim("gpt.flops", np.array([listed]),
                 np.array([dg.torch_flops(config, batch, seq_len, seed)]), "total FLOPs")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_larger_models_hold_every_claim(dtype: type, dropout: float) -> None:
    """The 4x benchmark shape (4 layers, 4 heads, width 64, 32 tokens), vocab 50, batch 4:
    saved tensors, every op, every parameter gradient and the logits, as in the fast tests."""
    config = dg.GPTConfig(vocab_size=50, block_size=32, n_layer=4, n_head=4, n_embd=64,
                          dropout=dropout)
    idx, targets = dg.tokens(config, 4, 32, 11)
    ref_counts, ref_held, torch_counts, torch_held = dg.saved_both(config, dtype, idx, targets)
    assert ref_counts == torch_counts
    assert_claim("gpt.saved_tensors", np.array([ref_held]), np.array([torch_held]), "held")
    pairs = (gp.layerwise_pairs(config, dtype, 4, 32, 11)[0]
             + gp.grad_pairs(config, dtype, 4, 32, 11)[0]
             + gp.carried_pairs(config, dtype, 4, 32, 11))
    for claim_id, where, actual, expected, scale in pairs:
        assert_claim(claim_id, actual, expected, where, scale=scale)


# -- under autocast (reference.amp against torch.autocast: parity/drivers/gpt_amp.py)
FMTS = st.sampled_from(ga.FMTS)


@given(config=gpt_configs(), fmt=FMTS, data=st.data())
@settings(max_examples=20)
def test_tape_under_autocast_holds_exactly_what_torchs_hooks_see(
        device: str, config: dg.GPTConfig, fmt: str, data: st.DataObject) -> None:
    """Every saved tensor (module, node.attr, shape, dtype, bytes) and the distinct storages'
    bytes, bf16 and fp16, dropout on and off; some of it is 2-byte."""
    if device != "cpu":
        pytest.skip("CPU lists (CUDA: softmax fp32, fused dropout): claimed on the CPU only")
    batch, seq_len, seed = data.draw(gpt_batches(config))
    event("dropout on" if config.dropout else "dropout off")
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    ref, ref_held, theirs, torch_held = ga.saved_both(config, fmt, idx, targets, device=device)
    assert ref == theirs, (
        f"reference only {sorted((ref - theirs).elements())}, "
        f"torch only {sorted((theirs - ref).elements())}")
    assert_claim("gpt.autocast_saved_tensors", np.array([ref_held]), np.array([torch_held]),
                 "bytes held (distinct storages)")
    lp = sum(n for (_, _, _, dtype, _), n in ref.items() if dtype == fmt)
    assert lp > 0, "nothing low-precision on the tape"


@given(config=gpt_configs(), fmt=FMTS, data=st.data())
@settings(max_examples=10, deadline=None)
def test_every_layer_under_autocast_within_the_rounding_spread_of_torch(
        device: str, config: dg.GPTConfig, fmt: str, data: st.DataObject) -> None:
    """Each Linear's output (the logits too), input gradient and parameter gradients within k
    lp ulps (k from the float32 bound), each LayerNorm and embedding within its float32
    claim; every parameter gradient compared."""
    if device != "cpu" and config.dropout > 0:
        pytest.skip("CPU dropout kernel")
    batch, seq_len, seed = data.draw(gpt_batches(config))
    pairs, compared, names = ga.layer_pairs(config, fmt, batch, seq_len, seed, device)
    assert compared == names, f"not compared: {sorted(names - compared)}"
    exact = total = 0
    for claim_id, where, a, b, k in pairs:
        if claim_id.startswith("gpt.autocast_layers"):
            assert_claim(claim_id, a, toward(b, a, k, fmt), where)
            exact, total = exact + int((k == 0).sum()), total + k.size
            if np.any((k > 0) & (a != b)):
                event("an element differs within its allowance")
        else:
            assert_claim(claim_id, a, b, where, scale=k)
    assert total and exact >= 0.5 * total, f"only {exact} of {total} elements must be exact"


@given(config=gpt_configs(max_layers=2), fmt=FMTS, data=st.data())
@settings(max_examples=8, deadline=None)
def test_free_running_autocast_differences_are_born_in_a_float32_op(
        device: str, config: dg.GPTConfig, fmt: str, data: st.DataObject) -> None:
    """Each tree runs itself under autocast from the tokens to every gradient: everything up
    to the first differing op output is bit-identical, and that op is a LayerNorm fed equal
    inputs (NOTE [ Where a free-running autocast run diverges ]); the residual stream between
    the ops within its carried bound."""
    from parity.drivers import gpt_free as gf

    if device != "cpu":
        pytest.skip("CPU autocast lists (CUDA: softmax fp32, fused dropout)")
    batch, seq_len, seed = data.draw(gpt_batches(config))
    run = gf.free_running(config, fmt, batch, seq_len, seed, device)
    event(f"first difference at {run.first.rsplit('.', 1)[-1] or 'none'}")
    for claim_id, where, a, b, s in run.residual:
        assert_claim(claim_id, a, b, where, scale=s)
    assert len(run.residual) == 2 * config.n_layer + 1
    if run.first:
        assert run.first_fed_equal and run.first_is_float32, (
            f"difference born at {run.first} (fed equal inputs: {run.first_fed_equal})")
    else:  # the forward agrees to the logits; the loss and the backward's float32 ops remain
        assert np.array_equal(run.ends[1][1], run.ends[1][2]), "logits differ"


_CORE_OPS = {"bmm", "scale", "masked_fill", "softmax", "softmax_backward"}


@given(config=gpt_configs(max_layers=2), fmt=FMTS, recompute=st.booleans(), data=st.data())
@settings(max_examples=10, deadline=None)
def test_attention_core_ops_under_autocast_within_the_rounding_spread_of_torch(
        device: str, config: dg.GPTConfig, fmt: str, recompute: bool,
        data: st.DataObject) -> None:
    """Each elementary op of every attention core (forward, backward, and the recomputed
    forward with selective recomputation), torch's op on the reference's own lp operands:
    within k lp ulps, k = 0 for the scale, the mask and dropout."""
    from parity.drivers import gpt_core_amp as gc

    if device != "cpu":
        pytest.skip("CPU autocast lists (CUDA: softmax fp32)")
    batch, seq_len, seed = data.draw(gpt_batches(config))
    pairs, calls = gc.core_pairs(config, fmt, batch, seq_len, seed, recompute, device)
    for claim_id, where, a, b, k in pairs:
        assert_claim(claim_id, a, toward(b, a, k, fmt), where)
        if np.any((k > 0) & (a != b)):
            event("an element differs within its allowance")
    ops = {op for op, *_ in calls}
    expected = _CORE_OPS | ({"dropout_forward", "dropout_backward"} if config.dropout else set())
    assert ops == expected, f"recorded {sorted(ops)}"
    softmaxes = sum(op == "softmax" for op, *_ in calls)
    assert softmaxes == config.n_layer * (2 if recompute else 1), "the recompute was not seen"
    lp = np.dtype(ramp.LP_DTYPES[fmt])
    assert all(out.dtype == lp for *_, out in calls), "an op of the core left the lp dtype"


@pytest.mark.parametrize("fmt", ga.FMTS)
def test_recomputed_core_reenters_its_forwards_autocast_state_under_cuda_lists(fmt: str) -> None:
    """Under CPU lists every op of the core already takes lp operands, so a recompute in the
    wrong autocast state gives the same bits; under the CUDA lists (the reference's
    emulation, no GPU needed) softmax runs in float32, so a recompute that does not re-enter
    its forward's state saves another p and the gradients change. Reference against itself:
    recomputed == stored, bit for bit, dropout on."""
    from reference import recompute_gpt as rrec

    config = dg.GPTConfig(dropout=0.1)
    idx, targets = dg.tokens(config, 2, 16, 3)
    grads = []
    for recompute in (False, True):
        model = rgpt.GPT(config, rng=np.random.default_rng(4))
        if recompute:
            rrec.recompute_attention_cores(model)
        with ramp.autocast(fmt, "cuda"):
            model.forward(idx, targets)
        if not recompute:  # the guard: the CUDA list does make p float32 here
            core = dict(model.named_modules())["transformer.h.0.attn.core"]
            p = core._saved["softmax:SoftmaxBackward0.result"]
            assert p.dtype == np.float32
        model.backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert_claim("recompute.gpt_grads_reference", grads[1][name], g, f"{fmt} {name}")
