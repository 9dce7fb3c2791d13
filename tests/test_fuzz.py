"""`python -m parity fuzz` does what it reports: every topic gets time within a short budget,
slow targets get fewer examples, the summary counts exactly the examples each target ran,
a target that never ran is reported as such (exit status 4), a failure is kept with its
falsifying example, and a time slice really ends a hypothesis run.

The scheduler is driven with fake targets on a fake clock (each example advances it by the
target's cost), so these tests are exact and fast; the last tests use real hypothesis tests.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity import fuzz_targets
from parity.lab import fuzz
from parity.lab.cli import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Fake:
    """A target whose examples cost `cost` seconds of the fake clock; it counts what it ran
    itself, independently of the scheduler's tally, and can fail at its k-th example."""

    def __init__(self, clock: Clock, cost: float, fail_at: int | None = None) -> None:
        self.clock, self.cost, self.fail_at = clock, cost, fail_at
        self.ran = 0

    def __call__(self, n: int, seconds: float | None) -> int:
        stop_at = None if seconds is None else self.clock.now + seconds
        done = 0
        while done < n and (done == 0 or stop_at is None or self.clock.now <= stop_at):
            self.clock.now += self.cost
            self.ran += 1
            done += 1
            if self.fail_at is not None and self.ran >= self.fail_at:
                raise fuzz.TargetFailed(done, "AssertionError: falsified at x=3")
        return done


def fakes(clock: Clock, spec: dict[str, list[float]]) -> tuple[list[fuzz.Target], list[Fake]]:
    targets, calls = [], []
    for topic, costs in spec.items():
        for i, cost in enumerate(costs):
            f = Fake(clock, cost)
            calls.append(f)
            targets.append(fuzz.Target(f"test_{topic}::t{i}", topic, f))
    return targets, calls


# The shape of the real suite: many cheap format targets, one very slow training target.
SUITE = {"formats": [0.001] * 30, "train": [1.0], "data": [0.05] * 5, "optim": [0.01] * 5}


@pytest.mark.parametrize("seconds", [20.0, 60.0, 300.0])
def test_every_topic_gets_a_fair_share_of_any_budget(seconds: float) -> None:
    """Each topic gets at least half its equal share of the budget; slow targets get fewer
    examples; the budget is overrun by at most one slow example."""
    clock = Clock()
    targets, _ = fakes(clock, SUITE)
    spent = fuzz.schedule(targets, seconds, seed=0, clock=clock)
    assert spent <= seconds + max(c for costs in SUITE.values() for c in costs)
    for topic in SUITE:
        ts = [t for t in targets if t.topic == topic]
        assert all(t.examples >= fuzz.FIRST_PASS for t in ts), topic
        assert sum(t.seconds for t in ts) >= 0.5 * seconds / len(SUITE), topic
    train = next(t for t in targets if t.topic == "train")
    cheap = next(t for t in targets if t.topic == "formats")
    assert train.examples < cheap.examples


def test_the_tally_is_exactly_what_each_target_ran() -> None:
    """Examples and calls in the summary equal the targets' own counts, and the last line's
    total is their sum."""
    clock = Clock()
    targets, calls = fakes(clock, SUITE)
    spent = fuzz.schedule(targets, 30.0, seed=1, clock=clock)
    assert [t.examples for t in targets] == [f.ran for f in calls]
    text, complete = fuzz.summary(targets, [], spent, 30.0, seed=1)
    assert complete
    total = sum(f.ran for f in calls)
    assert text.splitlines()[-1] == (f"fuzz: {len(targets)}/{len(targets)} targets ran, "
                                     f"{total:,} examples in {spent:.1f} s (seed 1), "
                                     "0 failing, complete")


def test_a_budget_too_short_names_the_targets_that_never_ran_and_exits_4() -> None:
    """With time for only a few first-pass examples, the summary says INCOMPLETE, lists the
    targets that did not run (shown as NOT RUN, never as ok), and the exit status is 4."""
    clock = Clock()
    targets, calls = fakes(clock, {"formats": [1.0] * 4, "train": [1.0] * 4})
    text, status = fuzz.run_targets(targets, [], 3.0, seed=0, clock=clock)
    never = [t for t, f in zip(targets, calls, strict=True) if f.ran == 0]
    assert never and status == EXIT_INCOMPLETE
    assert "INCOMPLETE" in text.splitlines()[-1]
    assert f"{len(targets) - len(never)}/{len(targets)} targets ran" in text
    for t in never:
        assert t.examples == 0
        row = next(line for line in text.splitlines() if line.startswith(t.label + " "))
        assert row.endswith("NOT RUN")
        assert t.label in text.splitlines()[-2]  # the "not run: ..." line


def test_a_failing_target_is_reported_with_its_example_and_not_run_again() -> None:
    clock = Clock()
    targets, calls = fakes(clock, {"formats": [0.01] * 3, "nn": [0.01] * 2})
    calls[1].fail_at = 5
    text, status = fuzz.run_targets(targets, [], 10.0, seed=0, clock=clock)
    assert status == EXIT_FAILED
    assert targets[1].failure is not None and calls[1].ran == 5
    assert "--- FAILED test_formats::t1" in text and "falsified at x=3" in text
    assert "1 failing" in text.splitlines()[-1]
    assert all(t.examples > 5 for t in targets if t is not targets[1])


def test_the_order_is_seeded_interleaves_topics_and_rotates() -> None:
    """The first targets cover every topic before any topic's second; the seed decides the
    order, the same seed gives the same order."""
    clock = Clock()
    targets, _ = fakes(clock, {"a": [1.0] * 3, "b": [1.0] * 2, "c": [1.0]})
    import random

    first = fuzz.interleaved(targets, random.Random(5))
    assert {t.topic for t in first[:3]} == {"a", "b", "c"}
    assert [t.label for t in first] == [t.label for t in
                                        fuzz.interleaved(targets, random.Random(5))]
    orders = {tuple(t.label for t in fuzz.interleaved(targets, random.Random(s)))
              for s in range(20)}
    assert len(orders) > 1


def test_a_complete_run_exits_0() -> None:
    clock = Clock()
    targets, _ = fakes(clock, {"formats": [0.01] * 3})
    assert fuzz.run_targets(targets, [], 5.0, seed=0, clock=clock)[1] == EXIT_OK


# -- real hypothesis tests -------------------------------------------------------------------

@settings(max_examples=5, database=None)
@given(data=st.data())
def _drawing_test(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 5))
    for _ in range(n):
        data.draw(st.floats())
    time.sleep(0.002)


@given(x=st.integers(0, 1000))
def _failing_test(x: int) -> None:
    if x:
        time.sleep(0.05)  # every failing example, shrinking's included, outlasts the slice
    assert x == 0, "falsified"


def test_a_time_slice_ends_a_real_hypothesis_run_without_a_false_failure() -> None:
    """A run asked for 100,000 examples stops after its 0.3 s slice; interactive draws
    (st.data) are not mistaken for flaky generation."""
    call = fuzz_targets._runner(_drawing_test, {}, [])
    began = time.monotonic()
    ran = call(100_000, 0.3)
    assert 1 <= ran < 100_000
    assert time.monotonic() - began < 5
    assert call(3, None) == 3
    assert _drawing_test._hypothesis_internal_use_settings.max_examples == 5, "restored"


def test_a_real_failure_is_kept_with_its_shrunk_example() -> None:
    """A failure found as the slice ends is still shrunk to the end (x=1) and reported with
    hypothesis' falsifying example, although shrinking takes longer than the slice."""
    call = fuzz_targets._runner(_failing_test, {}, [])
    began = time.monotonic()
    with pytest.raises(fuzz.TargetFailed) as caught:
        call(10_000, 0.1)
    assert time.monotonic() - began > 0.15
    assert "falsified" in caught.value.text and "x=1" in caught.value.text
    assert caught.value.examples > 2


def test_discovery_finds_every_topic_and_says_what_it_leaves_out(device: str) -> None:
    """Every parity topic with hypothesis tests has fuzz targets; what is left to pytest is
    named with the reason."""
    from parity.claims import TOPICS
    from parity.lab.report import parity_test_files

    found, left_out = fuzz_targets.discover(None, device)
    given = {t for t in TOPICS  # fsdp's and fp8_train's claims run fixed cases (launches)
             if any("@given(" in p.read_text(encoding="utf-8") for p in parity_test_files(t))}
    assert len(given) >= len(TOPICS) - 3
    assert {t.topic for t in found} == given
    assert len({t.label for t in found}) == len(found)
    assert all(": " in line for line in left_out)


def test_a_topic_spans_its_test_files_and_the_longest_topic_name_wins() -> None:
    """parity/test_<topic>_<part>.py belongs to <topic>; topics contain underscores, so
    test_loss_scaling.py is loss_scaling (not a part of a topic "loss"), and a module that
    names no topic belongs to none."""
    from parity.claims import TOPICS

    assert fuzz_targets.topic_of("test_numerics_gpt") == "numerics"
    assert fuzz_targets.topic_of("test_numerics") == "numerics"
    assert fuzz_targets.topic_of("test_loss_scaling") == "loss_scaling"
    assert fuzz_targets.topic_of("test_loss_scaling_gpt") == "loss_scaling"
    assert fuzz_targets.topic_of("test_train_kill") == "train"
    assert fuzz_targets.topic_of("test_trainer") is None  # a prefix without the underscore

    assert fuzz_targets.topic_of("test_elsewhere") is None
    with pytest.MonkeyPatch.context() as mp:  # the longest of two matching topics wins
        mp.setattr("parity.claims.TOPICS", (*TOPICS, "loss"))
        assert fuzz_targets.topic_of("test_loss_scaling_gpt") == "loss_scaling"
        assert fuzz_targets.topic_of("test_loss_x") == "loss"


def test_discovery_by_topic_takes_every_file_of_the_topic(device: str) -> None:
    """`--topic numerics` drives (or names, with the reason it cannot) the @given tests of
    parity/test_numerics.py, parity/test_numerics_format_view.py and
    parity/test_numerics_gpt.py, and no other topic's."""
    found, left_out = fuzz_targets.discover("numerics", device)
    assert {t.topic for t in found} == {"numerics"}
    files = {t.label.split("::")[0] for t in found} | {x.split("::")[0] for x in left_out}
    assert files == {"test_numerics", "test_numerics_format_view", "test_numerics_gpt"}
