"""reference.recompute against its own oracles: a brute-force search over every reversal
schedule, Griewank-Walther's closed form, plain backward, and torch's documented segment rule."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.strategies import examples, recompute_specs
from reference import nn
from reference import recompute as rc


def brute_force_cost(n: int, c: int) -> int:
    """Fewest advances reversing n steps with c slots, by Dijkstra over every action sequence.

    State: (current state index or -1 for none, stored indices, steps left to reverse). Actions:
    advance (cost 1), store the current state in a free slot, restore a stored one, drop a
    stored one, reverse the next step when the current state is its input (cost 0).
    """
    start = (0, frozenset(), n)
    dist, todo = {start: 0}, [(0, start)]
    while todo:
        d, (p, stored, left) = heapq.heappop(todo)
        if left == 0:
            return d
        if d > dist[(p, stored, left)]:
            continue
        moves = []
        if 0 <= p < left - 1:
            moves.append((1, (p + 1, stored, left)))
        if p == left - 1:
            moves.append((0, (-1, stored, left - 1)))
        if p >= 0 and p not in stored and len(stored) < c:
            moves.append((0, (p, stored | {p}, left)))
        for q in stored:
            moves.append((0, (q, stored - {q}, left)))
            moves.append((0, (p, stored - {q}, left)))
        for cost, state in moves:
            if d + cost < dist.get(state, math.inf):
                dist[state] = d + cost
                heapq.heappush(todo, (d + cost, state))
    raise AssertionError("unreachable")


def tanh_chain(n: int) -> nn.Sequential:
    return nn.Sequential(*(nn.Tanh() for _ in range(n)))


@pytest.mark.parametrize("c", [1, 2, 3])
@pytest.mark.parametrize("n", range(1, 8))
def test_optimal_recompute_count_equals_brute_force_and_closed_form(n: int, c: int) -> None:
    """Measured recomputed forwards of optimal:c == brute-force optimum == r n - beta(c+1, r-1)."""
    run = rc.forward_with_schedule(tanh_chain(n), np.ones((2, 3)), f"optimal:{c}")
    run.backward(np.ones((2, 3)))
    measured = sum(run.recomputed().values())
    assert measured == brute_force_cost(n, c) == rc.binomial_cost(n, c) == rc.revolve_cost(n, c)


@pytest.mark.slow
@pytest.mark.parametrize("c", range(1, 9))
def test_revolve_search_equals_closed_form_up_to_200_steps(c: int) -> None:
    """The search over every first split attains the closed form for n <= 200."""
    for n in range(1, 201):
        assert rc.revolve_cost(n, c) == rc.binomial_cost(n, c)


@pytest.mark.parametrize("spec", ["optimal:1", "optimal:2", "optimal:4", "uniform:4", "none"])
def test_peak_tape_of_equal_layers_matches_the_slot_count(spec: str) -> None:
    """A chain of equal layers peaks at S + 1 activations under optimal:S, n under none."""
    n, x = 12, np.ones((4, 8))
    run = rc.forward_with_schedule(tanh_chain(n), x, spec)
    run.backward(np.ones_like(x))
    schedule = rc.parse_schedule(spec, n)
    if schedule.slots is not None:
        assert run.peak_bytes == (schedule.slots + 1) * x.nbytes
        assert rc.checkpoints_held(schedule.plan) == schedule.slots
    elif spec == "none":
        assert run.peak_bytes == run.held_bytes == n * x.nbytes
    else:  # uniform:4: 3 inputs + the last segment's 3 tapes
        assert run.held_bytes == (3 + 3) * x.nbytes
        assert sum(run.recomputed().values()) == 3 * (n // 4)


@given(model=st.fixed_dictionaries({
    "sizes": st.lists(st.integers(1, 8), min_size=2, max_size=6),
    "activation": st.sampled_from(nn.ACTIVATIONS), "dropout": st.sampled_from((0.1, 0.5)),
    "seed": st.integers(0, 2**32 - 1)}), data=st.data())
@settings(examples(30))
def test_checkpointed_gradients_equal_plain_backward_bitwise(model: dict, data: st.DataObject
                                                              ) -> None:
    """Model.backward without any schedule and every schedule give the same gradient bits."""
    def make() -> nn.Sequential:
        return nn.make_mlp(model["sizes"], model["activation"], model["dropout"],
                           rng=np.random.default_rng(model["seed"]), dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((3, model["sizes"][0]))
    g = np.random.default_rng(2).standard_normal((3, model["sizes"][-1]))
    plain = make()
    dx = plain.backward(plain.forward(x) * 0 + g)
    mine = make()
    spec = data.draw(recompute_specs(len(mine)))
    run = rc.forward_with_schedule(mine, x, spec)
    assert np.array_equal(run.backward(g), dx)
    for (key, p), q in zip(mine.named_parameters(), plain.parameters(), strict=True):
        assert np.array_equal(p.grad, q.grad), key


def test_checkpoint_of_one_segment_recomputes_each_layer_once() -> None:
    """checkpoint(segment, x) holds only x and runs every layer again in backward."""
    model = nn.make_mlp((4, 5, 3), "relu", 0.5, rng=np.random.default_rng(0), dtype=np.float64)
    x = np.ones((2, 4))
    run = rc.checkpoint(model, x)
    assert [(s.name, s.shape) for s in run.tape()] == [("input", (2, 4))]
    run.backward(np.ones((2, 3)))
    assert run.recomputed() == dict.fromkeys(range(len(model)), 1)
    single = rc.checkpoint(nn.Tanh(), x)
    assert single.held_bytes == x.nbytes


def test_uniform_follows_torch_checkpoint_sequential_segment_rule() -> None:
    """uniform:K: K - 1 segments of n // K layers, the remaining layers not checkpointed."""
    plan = rc.parse_schedule("uniform:3", 10).plan
    assert plan == (rc.Segment(0, 3, (0, 1, 2)), rc.Segment(3, 6, (3, 4, 5)), 6, 7, 8, 9)
    assert rc.parse_schedule("uniform:1", 4).plan == (0, 1, 2, 3)
    assert rc.parse_schedule("sqrt", 16).plan == rc.parse_schedule("uniform:4", 16).plan


def test_without_rng_replay_dropout_gradients_are_wrong() -> None:
    """With preserve_rng_state=False the recompute draws new masks: gradients differ."""
    def run(preserve: bool) -> np.ndarray:
        model = nn.make_mlp((6, 16, 16, 2), "tanh", 0.5, rng=np.random.default_rng(3),
                            dtype=np.float64)
        r = rc.forward_with_schedule(model, np.ones((4, 6)), "uniform:2",
                                     preserve_rng_state=preserve)
        return r.backward(np.ones((4, 2)))
    assert not np.array_equal(run(False), run(True))


@pytest.mark.parametrize(("spec", "message"), [
    ("uniform:0", "1 <= K <= 5"), ("uniform:6", "1 <= K <= 5"), ("uniform:x", "integer K"),
    ("optimal:0", "S >= 1"), ("revolve", "accepted: none, sqrt"),
])
def test_bad_specs_are_refused_with_the_accepted_range(spec: str, message: str) -> None:
    """Out-of-range or unknown specs raise ValueError naming what is accepted."""
    with pytest.raises(ValueError, match=message):
        rc.parse_schedule(spec, 5)


def test_revolve_refuses_a_chain_with_no_slot_left() -> None:
    """Reversing two or more steps with no slot is impossible: an error, not a hang."""
    with pytest.raises(ValueError, match="at least one slot"):
        rc.revolve_cost(3, 0)
    with pytest.raises(ValueError, match="at least one slot"):
        rc.revolve_plan(0, 3, 0)


def test_bad_models_segments_and_budgets_are_refused() -> None:
    """A non-Sequential model, a mismatched schedule, bad segments, an over-budget plan."""
    model = tanh_chain(4)
    with pytest.raises(TypeError, match="Sequential"):
        rc.forward_with_schedule(nn.Tanh(), np.ones(3), "none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="for 5 layers, the model has 4"):
        rc.forward_with_schedule(model, np.ones(3), rc.parse_schedule("none", 5))
    with pytest.raises(ValueError, match=r"segments must be in \[1, 4\]"):
        rc.checkpoint_sequential(model, 0, np.ones(3))
    with pytest.raises(ValueError, match="needs 2 checkpoint slots but the budget is 1"):
        rc.check_budget(rc.parse_schedule("uniform:3", 4).plan, 1)
    with pytest.raises(ValueError, match="item 2 starts at 2, expected 1"):
        rc.Schedule("custom", 4, (0, 2, 3))
    with pytest.raises(ValueError, match=r"covers layers 0\.\.2, expected \.\.3"):
        rc.Schedule("custom", 4, (0, rc.Segment(1, 3, (1, 2))))
    with pytest.raises(ValueError, match="item 2 starts at 2, expected 1"):
        rc.Schedule("custom", 4, (0, rc.Segment(1, 4, (2, 3)), 3))
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        rc.Schedule("custom", 0, ())


def test_early_stop_skips_trailing_layers_that_save_nothing() -> None:
    """A segment's recompute stops after its last child that saved tensors (an eval-mode
    Dropout saves nothing); early_stop=False re-runs every child. Gradients agree."""
    def model() -> nn.Sequential:
        return nn.Sequential(nn.Tanh(), nn.Tanh(),
                             nn.Dropout(0.5, rng=np.random.default_rng(0)).eval(), nn.Tanh())
    schedule = rc.Schedule("custom", 4, (rc.Segment(0, 3, (0, 1, 2)), 3))
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    runs = {stop: rc.forward_with_schedule(model(), x, schedule, early_stop=stop)
            for stop in (True, False)}
    for run in runs.values():
        run.backward(np.ones_like(x))
    assert runs[True].recomputed() == {0: 1, 1: 1, 2: 0, 3: 0}
    assert runs[False].recomputed() == {0: 1, 1: 1, 2: 1, 3: 0}
    assert runs[True].interrupted() == {0: 0, 1: 1, 2: 0, 3: 0}  # torch cuts layer 1 short
    assert runs[False].interrupted() == dict.fromkeys(range(4), 0)
    assert np.array_equal(runs[True].grad_input, runs[False].grad_input)
    lone = rc.Schedule("custom", 4, (0, 1, rc.Segment(2, 3, (2,)), 3))
    for stop in (True, False):  # a segment that saved nothing is not recomputed at all
        run = rc.forward_with_schedule(model(), x, lone, early_stop=stop)
        run.backward(np.ones_like(x))
        assert run.recomputed() == dict.fromkeys(range(4), 0)
        assert run.checkpoints[0].recomputes == 0
