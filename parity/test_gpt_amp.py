"""reference.gpt under reference.amp against torch_impl.gpt under torch.autocast: the tape
(which tensors each op keeps, in which dtype), every Linear, LayerNorm and embedding, each op
of the attention core (recomputed too), and each tree running itself free. The runs and the
per-op allowances: parity/drivers/gpt_amp.py, gpt_core_amp.py, gpt_free.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim, assert_observed
from parity.drivers import gpt as dg
from parity.drivers import gpt_amp as ga
from parity.drivers.lp_ordinal import toward
from parity.strategies import examples, gpt_batches, gpt_configs
from reference import amp as ramp
from reference import gpt as rgpt

FMTS = st.sampled_from(ga.FMTS)



@given(config=gpt_configs(), fmt=FMTS, data=st.data())
@settings(examples(20))
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
    assert_claim("gpt.autocast_saved_tensors", actual=np.array([torch_held]),
                 expected=np.array([ref_held]), context="bytes held (distinct storages)")
    lp = sum(n for (_, _, _, dtype, _), n in ref.items() if dtype == fmt)
    assert lp > 0, "nothing low-precision on the tape"


@given(config=gpt_configs(), fmt=FMTS, data=st.data())
@settings(examples(10), deadline=None)
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
            assert_claim(claim_id, actual=toward(b, a, k, fmt), expected=a, context=where)
            exact, total = exact + int((k == 0).sum()), total + k.size
            if np.any((k > 0) & (a != b)):
                event("an element differs within its allowance")
        else:
            assert_claim(claim_id, actual=b, expected=a, context=where, scale=k)
    assert total and exact >= 0.5 * total, f"only {exact} of {total} elements must be exact"


@given(config=gpt_configs(max_layers=2), fmt=FMTS, data=st.data())
@settings(examples(8), deadline=None)
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
        assert_claim(claim_id, actual=b, expected=a, context=where, scale=s)
    assert len(run.residual) == 2 * config.n_layer + 1
    if run.first:
        born_elsewhere = not (run.first_fed_equal and run.first_is_float32)
        assert_observed("gpt.autocast_free", float(born_elsewhere), 1,
                        f"difference born at {run.first} (fed equal inputs: "
                        f"{run.first_fed_equal})")
    else:  # the forward agrees to the logits; the loss and the backward's float32 ops remain
        logits_differ = not np.array_equal(run.ends[1][1], run.ends[1][2])
        assert_observed("gpt.autocast_free", float(logits_differ), 1, "logits differ")


# free-running runs whose first difference is born in block 0's LayerNorm and is carried
# along the residual stream: found among 60 random float16 configurations (CPU, torch 2.13),
# at 0.9996 and 0.77 of gpt.autocast_free_residual's bound; the hypothesis draws above
# mostly diverge later, where the stream is still bit-identical (observed 0)
CARRIED_FREE_RUNS = (
    (dict(vocab_size=13, n_head=3, n_embd=24, dropout=0.1, bias=False, tie_weights=True),
     "float16", 3, 7, 2149014506),
    (dict(vocab_size=8, n_head=3, n_embd=24, dropout=0.3, bias=True, tie_weights=True),
     "float16", 2, 7, 1638499669),
)


@pytest.mark.parametrize(("fields", "fmt", "batch", "seq_len", "seed"), CARRIED_FREE_RUNS)
def test_free_running_residual_stream_holds_its_bound_where_differences_are_carried(
        device: str, fields: dict, fmt: str, batch: int, seq_len: int, seed: int) -> None:
    """Where a LayerNorm of the first block already differs, every later residual-stream
    input carries that difference, within the previous difference, the branch's and one lp
    and one float32 rounding (gpt.autocast_free_residual), near the bound itself."""
    from parity.drivers import gpt_free as gf

    if device != "cpu":
        pytest.skip("CPU autocast lists (CUDA: softmax fp32, fused dropout)")
    config = dg.GPTConfig(block_size=12, n_layer=2, **fields)
    run = gf.free_running(config, fmt, batch, seq_len, seed, device)
    for claim_id, where, a, b, s in run.residual:
        assert_claim(claim_id, actual=b, expected=a, context=where, scale=s)


_CORE_OPS = {"bmm", "scale", "masked_fill", "softmax", "softmax_backward"}


@given(config=gpt_configs(max_layers=2), fmt=FMTS, recompute=st.booleans(), data=st.data())
@settings(examples(10), deadline=None)
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
        assert_claim(claim_id, actual=toward(b, a, k, fmt), expected=a, context=where)
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
        assert_claim("recompute.gpt_grads_reference", actual=grads[1][name], expected=g,
                     context=f"{fmt} {name}")
