"""`python -m parity resume-check --fit module:fit` (parity/lab/your_trainer/resume_fit.py): a
loop a framework owns, driven through the project's callback; the framework saves at k and
resumes from its own checkpoint in a fresh process.

By default: a loop of its own standing in for a framework (it calls the FitRun's hooks as
the callbacks do), a fresh process each check. Behind `-m slow`, the real clients through
the real command line: transformers' Trainer (examples/resume_hf.py) and Lightning's fit
(examples/resume_lightning.py), each exact as written and caught with its seeded fault.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from parity.lab.your_trainer.resume_fit import FitRun, check_fit

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
STEPS, AT = 6, 3


def _loop(run: FitRun, keep_optimizer: bool = True, stop: int | None = None,
          keep_position: bool = True) -> None:
    """A framework's fit in miniature: its own loop, checkpoint and resume, calling the
    hooks where ResumeCheckCallback is called (before a step, after it, at the end);
    `keep_optimizer=False` saves the model alone, as `save_only_model=True` does;
    `keep_position=False` restarts its data at the first batch (a position in no state)."""
    torch.manual_seed(0)
    batches = torch.randn(STEPS, 4, 4, generator=torch.Generator().manual_seed(1))  # (N, B, C)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = 0
    if run.resume_from is not None:
        saved = torch.load(run.resume_from, weights_only=True)
        model.load_state_dict(saved["model"])
        if "optimizer" in saved:
            optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        step = saved["step"]
    position = step if keep_position else 0

    def state() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}

    while step < (run.steps if stop is None else stop):
        run.before(step, state())
        x = batches[position] + torch.randn(4, 4)  # (B, C), noise from the global generator
        position += 1
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        run.record(step, state())
        if run.should_save(step):
            os.makedirs(run.dir, exist_ok=True)
            path = os.path.join(run.dir, f"step-{step}.pt")
            torch.save({"model": model.state_dict(), "rng": torch.get_rng_state(),
                        "step": step,
                        **({"optimizer": optimizer.state_dict()} if keep_optimizer else {})},
                       path)
            run.saved(path)
    run.finish(state())


def complete(run: FitRun) -> None:
    _loop(run)


def model_only(run: FitRun) -> None:
    _loop(run, keep_optimizer=False)


def restarts_its_data(run: FitRun) -> None:
    _loop(run, keep_position=False)


def stops_early(run: FitRun) -> None:
    _loop(run, stop=run.steps - 1)


def no_callback(run: FitRun) -> None:
    pass


@pytest.mark.parametrize("fresh", [False, True], ids=["same process", "fresh process"])
def test_a_framework_loop_saving_the_model_alone_is_named_at_the_load(fresh: bool) -> None:
    """Saving the model alone: the runs part right after the load at the optimizer's state
    (missing after the resume), and the final weights differ; the same in a fresh process
    (~2.5 s: a torch import) as in this one."""
    bad = check_fit("test_resume_check_fit:model_only", steps=STEPS, at=AT,
                    fresh_process=fresh, cwd=HERE)
    assert (bad.resumed_pid != os.getpid()) is fresh
    assert not bad.ok and bad.parted_at == AT
    assert bad.parted[0].entry == "optimizer.state.0.step"
    assert bad.parted[0].detail == "missing after the resume"
    assert bad.final[0].entry == "model.0.weight"
    assert bad.summary() == ("resume-check: differs: first entry model.0.weight, the runs "
                             f"part at step {AT} at optimizer.state.0.step")


def test_a_complete_framework_loop_resumes_exactly() -> None:
    """The complete loop (the optimizer saved too): no entry parts at the load or after
    any step, and the final states are equal bit for bit (resumed in this process: the
    fresh one is the test above)."""
    report = check_fit(complete, steps=STEPS, at=AT, fresh_process=False)
    assert report.ok and report.parted_at is None and report.final == (), str(report)
    assert report.summary() == "resume-check: exact"


def test_what_no_state_holds_parts_the_runs_at_the_first_step_that_reads_it() -> None:
    """A data position in no state and not observed: the load restores everything the
    digests see, and the runs part after step AT + 1, the first to read another batch, at
    the first weight."""
    report = check_fit(restarts_its_data, steps=STEPS, at=AT, fresh_process=False)
    assert not report.ok and report.parted_at == AT + 1 and report.notes == ()
    assert report.parted[0].entry == "model.0.weight" == report.final[0].entry


@pytest.mark.parametrize(("fit", "words"), [
    ("no_callback", "never reached the resume-check callback"),
    ("stops_early", f"stopped at step {STEPS - 1}, not {STEPS}"),
    ("nowhere", "has no function nowhere"),
])
def test_a_fit_that_does_not_run_the_callback_as_asked_is_one_line_and_exit_2(
        fit: str, words: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found in the straight run, in this process, before any fresh process starts."""
    monkeypatch.chdir(HERE)
    status = main(["resume-check", "--fit", f"test_resume_check_fit:{fit}", "--steps",
                   str(STEPS), "--at", str(AT)])
    _, err = capsys.readouterr()
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1 and words in err, err


# the commands docs/your-trainer.md shows, run from the project's folder, and their last line
DOCS = [
    ("cd examples && python -m parity resume-check --fit resume_hf:fit --steps 6 --at 3",
     EXIT_OK, "resume-check: exact"),
    ("cd examples && python -m parity resume-check --fit resume_hf:fit_model_only --steps 6 "
     "--at 3", EXIT_FAILED, "resume-check: differs: first entry model.fc.weight, the runs "
                            "part at step 3 at optimizer.state.0.step"),
    ("cd examples && python -m parity resume-check --fit resume_lightning:fit --steps 8 "
     "--at 4", EXIT_OK, "resume-check: exact"),
    ("cd examples && python -m parity resume-check --fit resume_lightning:fit_without_rng "
     "--steps 8 --at 4", EXIT_FAILED, "resume-check: differs: first entry model.net.0.weight, "
                                      "the runs part at step 4 at rng.torch"),
]


def run_docs_command(line: str) -> subprocess.CompletedProcess[str]:
    """`cd examples && python -m parity ...` as a reader types it in the project's folder
    (`python`: this interpreter), the project on PYTHONPATH as for every page's commands
    (tests/test_docs_commands.py)."""
    folder, _, command = line.removeprefix("cd ").partition(" && ")
    argv = shlex.split(command)
    return subprocess.run([sys.executable, *argv[1:]], cwd=ROOT / folder, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                       "PYTHONPATH": str(ROOT)})


def test_the_page_shows_the_commands_these_tests_run() -> None:
    page = (ROOT / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    for line, _, last in DOCS:
        assert line in page.splitlines(), line
        assert f"`{last}`" in page, last


@pytest.mark.slow  # a transformers import in two processes, two Trainer runs: 16-18 s each
@pytest.mark.parametrize(("line", "status", "last"), DOCS[:2], ids=["as written",
                                                                     "save_only_model"])
def test_a_hugging_face_trainer_resumes_exactly_unless_it_saves_the_model_only(
        line: str, status: int, last: str) -> None:
    pytest.importorskip("transformers", reason="transformers is an optional oracle (the "
                                               "oracles extra)")
    pytest.importorskip("accelerate", reason="Trainer needs accelerate (the oracles extra)")
    done = run_docs_command(line)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == last


@pytest.mark.slow  # a Lightning import in two processes, two fits: 19-26 s each
@pytest.mark.parametrize(("line", "status", "last"), DOCS[2:], ids=["as written",
                                                                     "rng left out"])
def test_a_lightning_fit_resumes_exactly_unless_its_checkpoint_lacks_the_rng(
        line: str, status: int, last: str) -> None:
    pytest.importorskip("lightning", reason="lightning is an optional oracle")
    done = run_docs_command(line)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == last
