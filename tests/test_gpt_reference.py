"""reference.gpt against its own oracle: central finite differences of the loss (float64).

The parity claims along a whole run (gpt.logits, gpt.grads) carry each module's MEASURED
input difference, so an error in the glue between modules (a residual path, the position
embedding's batch sum) would be carried rather than seen; this oracle sees it. For each
parameter p and a random direction v, (L(p + h v) - L(p - h v)) / 2h must equal <dL/dp, v>:
truncation h^2 |L'''| / 6 and rounding ~ eps |L| / h, both < 1e-9 with h = 2^-18 and the
O(1) losses and derivatives of this small float64 model, so FD_TOL = 1e-7 (absolute plus
relative, as tests/test_nn_reference.py) is safe and still catches any wrong term.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference.gpt import GPT, GPTConfig

FD_STEP = 2.0**-18
FD_TOL = 1e-7


@pytest.mark.parametrize("tie", [False, True])
def test_every_parameter_gradient_matches_a_central_difference_of_the_loss(tie: bool) -> None:
    """<dL/dp, v> equals the central difference of the loss along v, for every parameter."""
    config = GPTConfig(vocab_size=5, block_size=6, n_layer=2, n_head=2, n_embd=8,
                       tie_weights=tie)
    model = GPT(config, rng=np.random.default_rng(0), dtype=np.float64)
    rng = np.random.default_rng(1)
    for p in model.parameters():  # away from the init's zeros and ones: every path matters
        p.data = p.data + 0.3 * rng.standard_normal(p.data.shape)
    idx = rng.integers(0, 5, (2, 5))
    targets = rng.integers(0, 5, (2, 5))
    model.zero_grad()
    model.forward(idx, targets)
    model.backward()
    for name, p in model.named_parameters():
        v = rng.standard_normal(p.data.shape)
        analytic = float(np.sum(p.grad * v))
        base = p.data.copy()
        losses = []
        for sign in (1.0, -1.0):
            p.data = base + sign * FD_STEP * v
            losses.append(float(model.forward(idx, targets)[1]))
            model.free_saved()
        p.data = base
        numeric = (losses[0] - losses[1]) / (2 * FD_STEP)
        assert abs(analytic - numeric) <= FD_TOL * (1 + abs(numeric)), (name, analytic, numeric)


def test_tied_weights_are_one_parameter_with_both_names_in_the_state_dict() -> None:
    """tie_weights: lm_head.weight IS wte.weight; named once, saved under both names."""
    model = GPT(GPTConfig(tie_weights=True), rng=np.random.default_rng(0))
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    state = model.state_dict()
    assert np.array_equal(state["lm_head.weight"], state["transformer.wte.weight"])
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="tied"):
        model.load_state_dict(state)


def test_backward_frees_the_whole_tape() -> None:
    """After backward nothing is held; a second backward without a forward is refused."""
    model = GPT(GPTConfig(dropout=0.1), rng=np.random.default_rng(0))
    idx = np.zeros((2, 4), dtype=np.int64)
    model.forward(idx, idx)
    assert model.held_bytes() > 0
    model.backward()
    assert model.tape() == [] and model.held_bytes() == 0
    with pytest.raises(RuntimeError, match="without a forward"):
        model.backward()
