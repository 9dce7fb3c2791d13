"""torch_impl.recompute against documented torch behaviour: checkpoint_sequential's segment
rule, non-reentrant early stop, the RNG replay, and the reentrant variant's silent trap."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import set_checkpoint_early_stop

from reference.recompute import Schedule
from torch_impl import nn as tnn
from torch_impl import recompute as trc


def mlp(dropout: float = 0.0, seed: int = 0) -> torch.nn.Sequential:
    return tnn.make_mlp((6, 8, 8, 8, 3), "tanh", dropout,
                        generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def grads(model: torch.nn.Sequential, spec: str | Schedule, seed: int = 0,
          requires_grad: bool = True, **kw: bool) -> tuple[dict, trc.Measurement]:
    model.zero_grad()
    x = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(4, 6).requires_grad_(requires_grad)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        m = trc.measure(model, x, torch.ones(4, 3, dtype=torch.float64), spec, **kw)
    return {k: None if p.grad is None else p.grad.clone()
            for k, p in model.named_parameters()}, m


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_uniform_plan_runs_like_torchs_checkpoint_sequential(k: int) -> None:
    """Our uniform:K plan, run segment by segment, recomputes and holds what torch's own
    checkpoint_sequential(model, K) does (its last segment is not checkpointed)."""
    model = mlp()
    _, theirs = grads(model, f"uniform:{k}")  # dispatches to torch's checkpoint_sequential
    _, ours = grads(model, Schedule("plan", len(model), trc.uniform_plan(len(model), k)))
    assert ours.started == theirs.started and ours.held_bytes == theirs.held_bytes
    size = len(model) // k
    assert sum(theirs.started.values()) == (k - 1) * size


def test_early_stop_interrupts_the_last_saving_layer_of_each_segment() -> None:
    """Non-reentrant recompute stops inside a segment's last layer: its forward hook never
    fires; with set_checkpoint_early_stop(False) every started forward finishes."""
    model = mlp()
    _, m = grads(model, "uniform:3")  # segments of 2: (Linear, Tanh), (Linear, Tanh)
    assert m.started == {0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0}
    assert m.finished == {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0}
    with set_checkpoint_early_stop(False):
        _, full = grads(model, "uniform:3")
    assert full.finished == full.started == m.started


def test_outer_saved_tensors_hook_sees_only_the_segment_input() -> None:
    """checkpoint(use_reentrant=False) shows an outer hook exactly one tensor: its input."""
    layer = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Tanh())
    x = torch.ones(5, 7, dtype=torch.float64, requires_grad=True)
    one = Schedule("one", 2, (trc.Segment(0, 2, (0, 1)),))
    m = trc.measure(layer, x, torch.ones(5, 7, dtype=torch.float64), one)
    assert [nbytes for _, nbytes, _ in m.held] == [5 * 7 * 8]
    assert m.held_bytes == 5 * 7 * 8


def test_nested_checkpoints_give_bitwise_gradients_and_revolve_counts() -> None:
    """optimal:S (nested non-reentrant checkpoints) keeps gradients and recomputes t(n, S)."""
    from reference.recompute import binomial_cost

    model = mlp(dropout=0.3)
    base, _ = grads(model, "none", seed=4)
    for s in (1, 2, 3):
        got, m = grads(model, f"optimal:{s}", seed=4)
        assert all(torch.equal(got[k], base[k]) for k in base)
        assert sum(m.started.values()) == binomial_cost(len(model), s)


def test_without_preserve_rng_state_dropout_gradients_differ() -> None:
    """preserve_rng_state=False: the recompute draws other masks, gradients are wrong."""
    model = mlp(dropout=0.5)
    base, _ = grads(model, "none", seed=1)
    kept, _ = grads(model, "uniform:2", seed=1)
    lost, _ = grads(model, "uniform:2", seed=1, preserve_rng_state=False)
    assert all(torch.equal(kept[k], base[k]) for k in base)
    assert not all(torch.equal(lost[k], base[k]) for k in base)


def test_reentrant_checkpoint_with_input_not_requiring_grad_drops_parameter_grads() -> None:
    """use_reentrant=True on an input without requires_grad: torch only warns, and the first
    segment's parameters silently get no gradient; the non-reentrant variant is correct."""
    model = mlp()
    base, _ = grads(model, "none", requires_grad=False)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        bad, _ = grads(model, "uniform:2", requires_grad=False, use_reentrant=True)
    assert bad["0.weight"] is None and bad["2.weight"] is None  # the checkpointed segment
    assert torch.equal(bad["6.weight"], base["6.weight"])  # the plain last segment is fine
    good, _ = grads(model, "uniform:2", requires_grad=False)
    assert all(torch.equal(good[k], base[k]) for k in base)


def test_reentrant_with_grad_requiring_input_matches_bitwise() -> None:
    """With an input that requires grad, the reentrant variant's gradients are the same bits."""
    model = mlp(dropout=0.3)
    base, _ = grads(model, "none", seed=2)
    got, m = grads(model, "uniform:2", seed=2, use_reentrant=True)
    assert all(torch.equal(got[k], base[k]) for k in base)
    assert m.finished == m.started  # no early stop in the reentrant variant


def test_errors_name_the_accepted_values() -> None:
    """Bad segment counts, non-Sequential models and unknown specs are refused clearly."""
    model = mlp()
    x = torch.ones(2, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"segments must be in \[1, 7\]"):
        trc.checkpoint_sequential(model, 8, x)
    with pytest.raises(TypeError, match=r"torch\.nn\.Sequential"):
        trc.forward_with_schedule(torch.nn.Tanh(), x, "none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="accepted: none, sqrt, uniform:K, optimal:S"):
        trc.parse_schedule("every-other", 7)
    with pytest.raises(ValueError, match="S >= 1"):
        trc.parse_schedule("optimal:0", 7)
