"""parity/lab/your_trainer/resume_check.py on trainers written as a user writes them
(tests/resume_trainers.py): the complete one resumes bit for bit, in a fresh process and
from a process SIGKILLed while saving; each one that leaves an entry out of its state_dict()
is caught, with that entry named at the step of the load and the first final entry that
differs; the comparison itself against hand-made tensors."""

from __future__ import annotations

import math
import os

import pytest
import resume_trainers
import torch

from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from parity.lab.your_trainer.resume_check import (
    ResumeCheckError,
    assert_resumes,
    check_resume,
    compare_leaf,
)

STEPS, AT = 8, 6


def test_a_complete_trainer_resumes_bit_for_bit_in_a_fresh_process() -> None:
    """The factory by its import path, the resume in a new interpreter: no entry differs at
    any step, although numpy's and Python's global generators (unused, seeded from the OS)
    differ between the two processes."""
    report = assert_resumes("resume_trainers:correct", steps=STEPS, at=AT)
    assert report.resumed_pid not in (0, os.getpid())  # another interpreter resumed it
    assert report.parted_at is None and report.final == ()
    assert report.summary() == "resume-check: exact"


def test_the_three_callables_are_a_trainer_too() -> None:
    assert check_resume(resume_trainers.as_callables, steps=4, at=2, fresh_process=False).ok


# (factory, the entry named right after the load: observed, not in the saved state)
LEFT_OUT = [
    (resume_trainers.no_optimizer, "trainer.optimizer.state.0.step"),
    (resume_trainers.no_rng, "rng.torch"),
    (resume_trainers.no_data_position, "trainer.pos"),
    (resume_trainers.no_scaler, "trainer.scaler.scale"),
    (resume_trainers.no_own_generator, "trainer.gen"),
]


@pytest.mark.parametrize(("factory", "entry"), LEFT_OUT, ids=lambda v: getattr(v, "__name__", v))
def test_an_entry_left_out_of_the_state_is_named_at_the_step_of_the_load(factory, entry) -> None:
    """The runs part at step AT (right after the load), the first entry differing there is
    the one the state lacks, and the final weights differ, the first entry named."""
    report = check_resume(factory, steps=STEPS, at=AT, fresh_process=False)
    assert not report.ok
    assert report.parted_at == AT
    assert report.parted[0].entry == entry and report.parted[0].where == "observed"
    assert all(d.where == "observed" for d in report.parted)  # what was saved loads back
    assert report.final[0].entry == "model.0.weight"
    assert report.summary() == (f"resume-check: differs: first entry model.0.weight, the "
                                f"runs part at step {AT} at {entry}")
    with pytest.raises(AssertionError, match=entry.replace(".", r"\.")):
        assert_resumes(factory, steps=STEPS, at=AT, fresh_process=False)


def test_a_trainer_that_saves_its_own_generator_resumes_bit_for_bit() -> None:
    """`self.gen`, a torch.Generator the trainer draws input noise from, saved and restored:
    exact, and nothing observed parts (its dropping is caught: LEFT_OUT)."""
    report = check_resume(resume_trainers.own_generator, steps=STEPS, at=AT,
                          fresh_process=False)
    assert report.ok and report.parted_at is None and report.final == ()
    assert report.summary() == "resume-check: exact"


def test_the_seeded_cases_really_have_state_to_lose_at_the_save() -> None:
    """Guard: by step AT the scale has left init_scale (overflow backoffs) and the optimizer
    has stepped (the first steps are skipped: before that its state is empty, and a trainer
    that drops it loses nothing, which the check rightly calls exact)."""
    t = resume_trainers.correct()
    init = t.scaler.get_scale()
    for _ in range(AT):
        t.step()
    assert t.scaler.get_scale() != init
    assert t.optimizer.state_dict()["state"]
    assert t.pos % resume_trainers.BATCHES != 0  # a position restarted at 0 is another batch


# The user's declared tolerance under test, not a parity bound: the load moves weights of
# magnitude < 1 by one float32 ulp (< 2^-24 = 6e-8), and the few SGD steps after it keep
# the parting far below 1e-5 while the bit-for-bit check (atol 0) sees it.
USER_ATOL = 1e-5


def test_a_difference_within_atol_passes_and_bit_for_bit_does_not() -> None:
    """A load that moves every first-layer weight one float32 ulp: the state parts right
    after the load at that entry; within atol 1e-5 the check passes and says so."""
    exact = check_resume(resume_trainers.nudged_on_load, steps=STEPS, at=AT,
                         fresh_process=False)
    assert not exact.ok and exact.parted_at == AT
    assert exact.parted[0].entry == "model.0.weight" and exact.parted[0].where == "state"
    loose = check_resume(resume_trainers.nudged_on_load, steps=STEPS, at=AT, atol=USER_ATOL,
                         fresh_process=False)
    assert loose.ok and loose.summary().startswith("resume-check: within atol 1e-05")


def test_an_observed_entry_alone_does_not_fail_the_check() -> None:
    """`logged`, an int the trainer counts but does not save, differs right after the load;
    the saved state never does: exact, and the summary says what parted."""
    report = check_resume(resume_trainers.counts_its_steps, steps=4, at=2,
                          fresh_process=False)
    assert report.ok and report.final == ()
    assert report.parted_at == 2 and [d.entry for d in report.parted] == ["trainer.logged"]
    assert report.summary() == ("resume-check: exact (observed entries part at step 2, the "
                                "saved state never)")


def test_a_state_that_needs_pickle_is_refused_naming_the_entry() -> None:
    with pytest.raises(TypeError, match=r"entry noise is a numpy\.ndarray, which needs pickle"):
        check_resume(resume_trainers.numpy_array_in_state, steps=4, at=2, fresh_process=False)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"steps": 4, "at": 4}, "1 <= at < steps"),
    ({"steps": 4, "at": 0}, "1 <= at < steps"),
    ({"steps": 4, "at": 2, "atol": math.nan}, "atol nan"),
    ({"steps": 4, "at": 2, "fresh_process": True}, "importable 'module:function'"),
])
def test_bad_arguments_are_refused_with_the_reason(kwargs, words) -> None:
    kwargs = {"fresh_process": False, **kwargs}
    with pytest.raises(ResumeCheckError, match=words):
        check_resume(resume_trainers.correct, **kwargs)


def test_a_factory_that_builds_no_trainer_is_named() -> None:
    with pytest.raises(ResumeCheckError, match="without state_dict, load_state_dict, step"):
        check_resume(lambda: object(), steps=2, at=1, fresh_process=False)
    with pytest.raises(ResumeCheckError, match="cannot import no_such_module"):
        check_resume("no_such_module:f", steps=2, at=1)


def test_compare_leaf_holds_bits_atol_nan_and_infinities() -> None:
    """The final comparison on hand-made values: one ulp is a difference bit for bit and not
    within atol; NaN against NaN and inf against inf are equal; NaN against a number never is."""
    a = torch.tensor([1.0, math.inf, math.nan])
    ulp = torch.tensor([1.0 + 2.0**-23, math.inf, math.nan])  # float32's next after 1
    assert compare_leaf(a, a.clone(), None) is None
    assert compare_leaf(a, ulp, None) == "max |Δ| 1.19e-07 over 1 of 3 values (bit for bit)"
    assert compare_leaf(a, ulp, 1e-6) is None
    assert "max |Δ| inf" in compare_leaf(a, torch.tensor([1.0, math.inf, 0.0]), 1e9)
    assert "max |Δ| inf" in compare_leaf(a, torch.tensor([1.0, -math.inf, math.nan]), 1e9)
    assert compare_leaf(torch.tensor([1, 2]), torch.tensor([1, 3]), 10.0) == "1 of 2 values differ"
    assert "float32 (2,) straight, float16 (2,) resumed" == compare_leaf(
        torch.zeros(2), torch.zeros(2, dtype=torch.float16), None)
    assert compare_leaf(torch.tensor(-0.0), torch.tensor(0.0), None) is not None  # bits
    assert compare_leaf(3, 4, 10.0) == "3 straight, 4 resumed"  # ints exactly, atol or not


@pytest.mark.slow  # two fresh processes, one of them killed: ~5 s
@pytest.mark.parametrize("factory", ["correct", "no_rng"])
def test_a_save_sigkilled_midway_leaves_the_previous_checkpoint_to_resume_from(factory) -> None:
    """The process that saved step AT is killed writing step AT + 1 into the same file: the
    file still holds step AT, whole, and resuming from it is exact (or caught, as before)."""
    report = check_resume(f"resume_trainers:{factory}", steps=STEPS, at=AT, kill=True)
    assert report.killed is not None and f"still holds step {AT}" in report.killed
    assert ".tmp" in report.killed  # the kill landed mid-save: its temporary file is left
    assert report.ok == (factory == "correct") and report.notes == ()
    if factory == "no_rng":
        assert report.parted_at == AT and report.parted[0].entry == "rng.torch"


def test_the_command_line_exit_status_and_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    """resume-check: 0 and `exact`; 1 and `differs` with the entry, or one line when the
    trainer raises; 2 for bad input."""
    base = ["--steps", "4", "--at", "2", "--same-process"]
    assert main(["resume-check", "resume_trainers:correct", *base]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "resume-check: exact"
    assert main(["resume-check", "resume_trainers:no_data_position", *base]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "trainer.pos (observed): differs" in out
    assert out.splitlines()[-1].startswith("resume-check: differs: first entry model.0.weight")
    assert main(["resume-check", "resume_trainers:fails_to_load", *base]) == EXIT_FAILED
    assert capsys.readouterr().out.splitlines()[-1] == ("resume-check: failed: the trainer "
                                                        "raised KeyError: 'scaler'")
    assert main(["resume-check", "resume_trainers", *base]) == EXIT_USAGE
    assert "expected module:function" in capsys.readouterr().err

