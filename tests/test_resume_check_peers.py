"""Resume bugs peers shipped, each seeded into a small user's loop in examples/peers/ beside
its repair, and caught by resume-check's factory mode (parity/lab/your_trainer/
resume_check.py): the faulty loop differs, with the first entry and the step the page
docs/your-trainer.md names; the repaired one is exact. Beside them, what each bug really
does, computed on its own (a step count one ahead, rows dropped and repeated), and the
stale-state guard (resume_stale.py) on hand-made digests."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import torch

from parity.lab.cli import EXIT_FAILED, EXIT_OK, main
from parity.lab.your_trainer.resume_check import check_resume
from parity.lab.your_trainer.resume_stale import stale_entry
from reference.data import epoch_order

PEERS = Path(__file__).resolve().parents[1] / "examples" / "peers"

# example, steps, at, the faulty loop's last line (its first entry, where the runs part)
CASES = [
    ("adam_warmup", 6, 3, "resume-check: differs: first entry model.0.weight, the runs part "
                          "at step 3 at optimizer.state.0.step"),
    ("iter_before_load", 6, 3, "resume-check: differs: first entry model.0.weight, the runs "
                               "part at step 4 at model.0.weight"),
    ("cached_state_dict", 6, 3, "resume-check: differs: first entry model.0.weight, the runs "
                                "part at step 3 at trainer.model.0.weight"),
    ("uneven_shards", 6, 4, "resume-check: differs: first entry seen, the runs part at step 5 "
                            "at seen"),
]


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A loader of examples/peers/<name>.py, as `cd examples/peers` makes it importable."""
    monkeypatch.syspath_prepend(str(PEERS))

    class Peers(ModuleType):
        def __getattr__(self, name: str) -> ModuleType:
            return importlib.import_module(name)

    return Peers("peers")


@pytest.mark.parametrize(("name", "steps", "at", "last"), CASES, ids=[c[0] for c in CASES])
def test_each_peers_bug_is_caught_and_its_repair_resumes_exactly(
        peers: ModuleType, name: str, steps: int, at: int, last: str) -> None:
    """The faulty loop's report ends with the line the page gives; the repaired loop's with
    `resume-check: exact`, no entry parting at any step."""
    example = getattr(peers, name)
    report = check_resume(example.faulty, steps=steps, at=at, fresh_process=False)
    assert not report.ok and report.summary() == last, str(report)
    fixed = check_resume(example.repaired, steps=steps, at=at, fresh_process=False)
    assert fixed.ok and fixed.parted_at is None and fixed.final == (), str(fixed)


def test_the_command_catches_the_warm_up_step_in_a_fresh_process(
        peers: ModuleType, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`cd examples/peers && python -m parity resume-check adam_warmup:...`: exit 1 and the
    line the page gives for the faulty loop, exit 0 and exact for the repaired one, each
    resumed by a new interpreter."""
    monkeypatch.chdir(PEERS)
    base = ["--steps", "6", "--at", "3"]
    assert main(["resume-check", "adam_warmup:faulty", *base]) == EXIT_FAILED
    assert capsys.readouterr().out.splitlines()[-1] == CASES[0][3]
    assert main(["resume-check", "adam_warmup:repaired", *base]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "resume-check: exact"


def _resumed(example: ModuleType, factory: str, steps: int, at: int) -> object:
    """The loop run to `at`, its state loaded into a fresh one, run to `steps` (by hand)."""
    first = getattr(example, factory)()
    for _ in range(at):
        first.step()
    again = getattr(example, factory)()
    again.load_state_dict(first.state_dict())
    for _ in range(at, steps):
        again.step()
    return again


def _straight(example: ModuleType, factory: str, steps: int) -> object:
    trainer = getattr(example, factory)()
    for _ in range(steps):
        trainer.step()
    return trainer


def test_the_warm_up_after_the_load_puts_adamw_one_step_ahead(peers: ModuleType) -> None:
    """What the faulty loop does, read off AdamW: every parameter's step count is the
    uninterrupted run's plus one; the repaired loop's are the uninterrupted run's."""
    ex = peers.adam_warmup
    straight = [s["step"] for s in _straight(ex, "faulty", 6).optimizer.state.values()]
    bad = [s["step"] for s in _resumed(ex, "faulty", 6, 3).optimizer.state.values()]
    good = [s["step"] for s in _resumed(ex, "repaired", 6, 3).optimizer.state.values()]
    assert [float(s) for s in straight] == [6.0] * 4
    assert [float(s) for s in bad] == [7.0] * 4
    assert [float(s) for s in good] == [6.0] * 4


def test_an_iterator_made_before_the_load_restarts_at_row_zero(peers: ModuleType) -> None:
    """The faulty loop's first batch after the load is the table's first, the repaired
    loop's the one after the 3 batches of 4 rows taken before the save."""
    ex = peers.iter_before_load
    table = ex.Trainer(iter_at_init=False).loader.dataset
    for factory, first_row in (("faulty", 0), ("repaired", 12)):
        saved = getattr(ex, factory)()
        for _ in range(3):
            saved.step()
        again = getattr(ex, factory)()
        again.load_state_dict(saved.state_dict())
        if again.batches is None:
            again.batches = again._iter()
        x, _ = next(again.batches)
        assert torch.equal(x[0], table[first_row][0]), factory


def test_the_repaired_shards_follow_the_global_rule_across_the_world_size_change(
        peers: ModuleType) -> None:
    """The rule (examples/peers/uneven_shards.py): 2 ranks for 4 steps, then 3 ranks for 2
    trains on the first 12 rows of each epoch's order (reference.data.epoch_order), epochs
    0, 1, 2, each once: no row dropped, none repeated; the faulty loop's resumed run drops
    some rows and repeats others."""
    ex = peers.uneven_shards
    whole = ex.BATCH * (ex.ROWS // ex.BATCH)  # rows of an epoch in whole global batches
    expected = Counter(int(i) for e in range(3)
                       for i in epoch_order(ex.SEED, e, ex.ROWS)[:whole])
    good = _resumed(ex, "repaired", 6, 4).seen.tolist()
    assert good == [expected[i] for i in range(ex.ROWS)]
    straight = _straight(ex, "faulty", 6).seen
    bad = _resumed(ex, "faulty", 6, 4).seen
    assert (bad > straight).any() and (bad < straight).any(), (bad, straight)


def _trail(*steps: tuple[dict[str, str], dict[str, str]]) -> list[dict[str, dict[str, str]]]:
    return [{"state": s, "observed": o} for s, o in steps]


def test_the_stale_state_guard_names_an_entry_that_stops_following_the_trainer() -> None:
    """NOTE [ A state that does not move ]: a state entry equal to the trainer's entry of
    the same name, then kept while the trainer's moves, is named with both steps; a live
    state, a state entry of another name, one that merely equals an unrelated entry, and a
    copy kept on purpose under a name of its own are not."""
    stale = _trail(({"model.w": "a", "pos": "0"}, {"trainer.model.w": "a", "trainer.pos": "0"}),
                   ({"model.w": "a", "pos": "0"}, {"trainer.model.w": "b", "trainer.pos": "1"}))
    assert stale_entry(stale) == ("model.w", "trainer.model.w", 0, 1)
    live = _trail(({"model.w": "a"}, {"trainer.model.w": "a"}),
                  ({"model.w": "b"}, {"trainer.model.w": "b"}),
                  ({"model.w": "b"}, {"trainer.model.w": "b"}))  # a skipped step
    assert stale_entry(live) is None
    other = _trail(({"model.w": "a"}, {"trainer.model.v": "a"}),
                   ({"model.w": "a"}, {"trainer.model.v": "b"}))
    assert stale_entry(other) is None
    frozen = _trail(({"buf.zero": "z"}, {"trainer.net.w": "z"}),
                    ({"buf.zero": "z"}, {"trainer.net.w": "y"}))
    assert stale_entry(frozen) is None
    best = _trail(({"best.w": "a", "model.w": "a"}, {"trainer.model.w": "a"}),
                  ({"best.w": "a", "model.w": "b"}, {"trainer.model.w": "b"}))
    assert stale_entry(best) is None  # the best weights so far, kept on purpose
    lagging = _trail(({"m.w": "a"}, {"trainer.m.w": "a"}), ({"m.w": "b"}, {"trainer.m.w": "b"}),
                     ({"m.w": "b"}, {"trainer.m.w": "c"}))  # live at first, then cached
    assert stale_entry(lagging) == ("m.w", "trainer.m.w", 1, 2)
    lazy = _trail(({}, {}), ({"opt.s": "a"}, {"trainer.opt.s": "a"}),
                  ({"opt.s": "a"}, {"trainer.opt.s": "b"}))  # an entry made at step 1
    assert stale_entry(lazy) == ("opt.s", "trainer.opt.s", 1, 2)


def test_the_page_shows_each_example_with_the_line_these_tests_hold_it_to() -> None:
    """docs/your-trainer.md's table and commands: each example's command, with the steps
    these tests use, and its faulty loop's last line."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "your-trainer.md").read_text()
    for name, steps, at, last in CASES:
        assert (f"cd examples/peers && python -m parity resume-check {name}:faulty --steps "
                f"{steps} --at {at}") in page, name
        assert f"`{last}`" in page, name
