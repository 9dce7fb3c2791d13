"""The compact transformer under autocast, reference.amp against torch.autocast: the tape's
bytes, and every Linear (the logits among them), LayerNorm and embedding of one run fed the
reference's own operands. Driver: parity/drivers/gpt_amp.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers import gpt as dg
from parity.drivers import gpt_amp as ga
from parity.drivers.amp import toward
from parity.strategies import gpt_batches, gpt_configs

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
