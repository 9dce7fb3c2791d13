"""torch_impl.recompute against documented torch behaviour: checkpoint_sequential's segment
rule, non-reentrant early stop, what an outer saved_tensors_hook sees (by torch version), the
RNG replay on the device's generator, and the reentrant variant's silent trap. Every test runs
on the --device."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import set_checkpoint_early_stop

from reference.recompute import Schedule
from torch_impl import nn as tnn
from torch_impl import recompute as trc


def mlp(device: str, dropout: float = 0.0, seed: int = 0) -> torch.nn.Sequential:
    return tnn.make_mlp((6, 8, 8, 8, 3), "tanh", dropout,
                        generator=torch.Generator().manual_seed(seed), dtype=torch.float64,
                        device=device)


def grads(model: torch.nn.Sequential, spec: str | Schedule, seed: int = 0,
          requires_grad: bool = True, **kw: bool) -> tuple[dict, trc.Measurement]:
    model.zero_grad()
    device = next(model.parameters()).device
    x = torch.linspace(-1, 1, 24, dtype=torch.float64, device=device).reshape(4, 6)
    x.requires_grad_(requires_grad)
    with torch.random.fork_rng():  # the CPU and every CUDA generator
        torch.manual_seed(seed)
        m = trc.measure(model, x, torch.ones(4, 3, dtype=torch.float64, device=device), spec,
                        **kw)
    return {k: None if p.grad is None else p.grad.clone()
            for k, p in model.named_parameters()}, m


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_uniform_plan_runs_like_torchs_checkpoint_sequential(k: int, device: str) -> None:
    """Our uniform:K plan, run segment by segment, recomputes and holds what torch's own
    checkpoint_sequential(model, K) does (its last segment is not checkpointed)."""
    model = mlp(device)
    _, theirs = grads(model, f"uniform:{k}")  # dispatches to torch's checkpoint_sequential
    _, ours = grads(model, Schedule("plan", len(model), trc.uniform_plan(len(model), k)))
    assert ours.started == theirs.started and ours.held_bytes == theirs.held_bytes
    size = len(model) // k
    assert sum(theirs.started.values()) == (k - 1) * size


def test_early_stop_interrupts_the_last_saving_layer_of_each_segment(device: str) -> None:
    """Non-reentrant recompute stops inside a segment's last layer: its forward hook never
    fires; with early_stop=False (set_checkpoint_early_stop(False) around the forward, which
    every checkpoint frame reads when created) every started forward finishes."""
    model = mlp(device)
    _, m = grads(model, "uniform:3")  # segments of 2: (Linear, Tanh), (Linear, Tanh)
    assert m.started == {0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0}
    assert m.finished == {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0}
    _, full = grads(model, "uniform:3", early_stop=False)
    assert full.finished == full.started == m.started
    with set_checkpoint_early_stop(False):  # the argument wins over an enclosing switch
        _, inner = grads(model, "uniform:3", early_stop=True)
    assert inner.finished == m.finished


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_segment_that_saved_nothing_is_never_recomputed(early_stop: bool, device: str) -> None:
    """The recompute starts at the first unpack of a saved tensor: a checkpointed eval-mode
    Dropout saves nothing and never runs again, early stop or not; the Tanh segment does."""
    model = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Dropout(0.5).eval(), torch.nn.Tanh())
    x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True, device=device)
    plan = Schedule("custom", 3, (trc.Segment(0, 1, (0,)), trc.Segment(1, 2, (1,)), 2))
    m = trc.measure(model, x, torch.ones(2, 3, dtype=torch.float64, device=device), plan,
                    early_stop=early_stop)
    assert m.started == {0: 1, 1: 0, 2: 0}


def test_outer_saved_tensors_hook_sees_the_segment_input_and_before_2_12_a_dummy(
        device: str) -> None:
    """checkpoint(use_reentrant=False) shows an outer hook one tensor with bytes, its input;
    torch < 2.12 also packs the 0-element dummy of its _NoopSaveInputs Function (the gate
    CHECKPOINT_PACKS_DUMMY), torch >= 2.12 has no such Function and packs nothing else."""
    layer = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Tanh())
    x = torch.ones(5, 7, dtype=torch.float64, requires_grad=True, device=device)
    one = Schedule("one", 2, (trc.Segment(0, 2, (0, 1)),))
    m = trc.measure(layer, x, torch.ones(5, 7, dtype=torch.float64, device=device), one)
    dummy = [0] if trc.CHECKPOINT_PACKS_DUMMY else []
    assert sorted(nbytes for _, nbytes, _ in m.held) == [*dummy, 5 * 7 * 8]
    assert m.held_bytes == 5 * 7 * 8
    assert hasattr(torch.utils.checkpoint, "_NoopSaveInputs") == trc.CHECKPOINT_PACKS_DUMMY


def test_nested_checkpoints_give_bitwise_gradients_and_revolve_counts(device: str) -> None:
    """optimal:S (nested non-reentrant checkpoints) keeps gradients and recomputes t(n, S)."""
    from reference.recompute import binomial_cost

    model = mlp(device, dropout=0.3)
    base, _ = grads(model, "none", seed=4)
    for s in (1, 2, 3):
        got, m = grads(model, f"optimal:{s}", seed=4)
        assert all(torch.equal(got[k], base[k]) for k in base)
        assert sum(m.started.values()) == binomial_cost(len(model), s)


def test_without_preserve_rng_state_dropout_gradients_differ(device: str) -> None:
    """preserve_rng_state=False: the recompute draws other masks from the device's generator,
    gradients are wrong; with it, they are the bits of no checkpointing."""
    model = mlp(device, dropout=0.5)
    base, _ = grads(model, "none", seed=1)
    kept, _ = grads(model, "uniform:2", seed=1)
    lost, _ = grads(model, "uniform:2", seed=1, preserve_rng_state=False)
    assert all(torch.equal(kept[k], base[k]) for k in base)
    assert not all(torch.equal(lost[k], base[k]) for k in base)


def test_reentrant_checkpoint_with_input_not_requiring_grad_drops_parameter_grads(
        device: str) -> None:
    """use_reentrant=True on an input without requires_grad: torch only warns, and the first
    segment's parameters silently get no gradient; the non-reentrant variant is correct."""
    model = mlp(device)
    base, _ = grads(model, "none", requires_grad=False)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        bad, _ = grads(model, "uniform:2", requires_grad=False, use_reentrant=True)
    assert bad["0.weight"] is None and bad["2.weight"] is None  # the checkpointed segment
    assert torch.equal(bad["6.weight"], base["6.weight"])  # the plain last segment is fine
    good, _ = grads(model, "uniform:2", requires_grad=False)
    assert all(torch.equal(good[k], base[k]) for k in base)


def test_reentrant_with_grad_requiring_input_matches_bitwise(device: str) -> None:
    """With an input that requires grad, the reentrant variant's gradients are the same bits."""
    model = mlp(device, dropout=0.3)
    base, _ = grads(model, "none", seed=2)
    got, m = grads(model, "uniform:2", seed=2, use_reentrant=True)
    assert all(torch.equal(got[k], base[k]) for k in base)
    assert m.finished == m.started  # no early stop in the reentrant variant


def test_errors_name_the_accepted_values(device: str) -> None:
    """Bad segment counts, non-Sequential models and unknown specs are refused clearly."""
    model = mlp(device)
    x = torch.ones(2, 6, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match=r"segments must be in \[1, 7\]"):
        trc.checkpoint_sequential(model, 8, x)
    with pytest.raises(TypeError, match=r"torch\.nn\.Sequential"):
        trc.forward_with_schedule(torch.nn.Tanh(), x, "none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="accepted: none, sqrt, uniform:K, optimal:S"):
        trc.parse_schedule("every-other", 7)
    with pytest.raises(ValueError, match="S >= 1"):
        trc.parse_schedule("optimal:0", 7)
    with pytest.raises(ValueError, match="for 8 layers, the model has 7"):
        trc.forward_with_schedule(model, x, trc.parse_schedule("none", 8))
    with pytest.raises(ValueError, match="slots >= 1"):
        trc.revolve_plan(0, 3, 0)
