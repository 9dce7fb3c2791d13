"""`python -m parity train --world-size N`'s contracts: the options it cannot take are refused
naming the option, before anything is written; the directory policy (ckpt/commit_policy.py)
refuses a directory of the single-process command or of the other tree, keeps --keep
commits, removes a killed save's directory, and refuses a changed configuration on
--resume naming the field; a resume at another N says it resharded. The reference tree's
simulated ranks run here (no processes); the kill tests are parity/test_ddp_train.py.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from ckpt import commit as ckc
from parity.lab.cli import main


def _train(directory: Path, *options: str, impl: str = "reference", steps: int = 4,
           world_size: int = 2) -> tuple[int, list[str], str]:
    """(exit status, stdout lines, stderr) of the command run here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["train", "--impl", impl, "--steps", str(steps), "--checkpoint-dir",
                       str(directory), "--world-size", str(world_size),
                       "--checkpoint-every", "2", *options])
    return status, out.getvalue().splitlines(), err.getvalue()


REFUSED = [
    (("--precision", "fp8-tensorwise"), "--precision fp8-tensorwise"),
    (("--recompute", "sqrt"), "--recompute sqrt"),
    (("--schedule", "cosine"), "--schedule cosine"),
    (("--horizon", "10"), "--horizon"),
    (("--loader-workers", "2"), "--loader-workers 2"),
    (("--check-numerics",), "--check-numerics"),
    (("--fault", "fp16_overflow_no_scaler"), "--fault"),
    (("--world-size", "5"), "--world-size 5"),
]


@pytest.mark.parametrize(("options", "named"), REFUSED)
def test_an_option_the_ranks_cannot_take_is_refused_naming_it(
        tmp_path: Path, options: tuple[str, ...], named: str) -> None:
    """Exit 2, one line on stderr naming the option, the directory not even created."""
    if options[0] == "--fault":
        from reference.faults import FAULTS

        options = ("--fault", next(iter(FAULTS)))
    status, lines, err = _train(tmp_path / "run", *options)
    assert status == 2 and lines == [], (status, lines)
    assert named in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_fsdp_on_one_rank_is_refused_unless_it_resumes_a_commit(tmp_path: Path) -> None:
    """FSDP2 shards over N > 1 ranks: one rank, started afresh, is one line and exit 2; one
    rank resuming a 2-rank FSDP2 commit continues it (fsdp.gpt_reshard holds what it loads)."""
    gpt = ("--model", "gpt", "--parallel", "fsdp", "--horizon", "6")
    status, lines, err = _train(tmp_path / "fresh", *gpt, world_size=1)
    assert (status, lines) == (2, []) and "--parallel fsdp" in err and err.count("\n") == 1
    assert not (tmp_path / "fresh").exists()
    assert _train(tmp_path / "run", *gpt, steps=2)[0] == 0
    status, lines, err = _train(tmp_path / "run", *gpt, "--resume", steps=4, world_size=1)
    assert status == 0 and lines[-1].startswith("state-sha256: "), err
    assert ckc.newest(tmp_path / "run", "npy-records")[0].world_size == 1


def test_device_cuda_is_refused_for_the_ranks(tmp_path: Path) -> None:
    status, _, err = _train(tmp_path / "run", "--device", "cuda", impl="torch")
    assert status == 2 and "--device cuda" in err and "gloo on the cpu" in err, err


def test_a_run_keeps_its_newest_commits_and_a_rerun_is_refused_until_resume(
        tmp_path: Path) -> None:
    """--keep 2 of saves at 2, 4, 6: records 4 and 6 and their directories, nothing else;
    the same command again (no --resume) is refused with nothing changed."""
    directory = tmp_path / "run"
    status, lines, _ = _train(directory, "--keep", "2", steps=6)
    assert status == 0 and lines[-1].startswith("state-sha256: ")
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["COMMITTED-00000004.json", "COMMITTED-00000006.json",
                     "step-00000004", "step-00000006"], names
    before = {p: p.stat().st_mtime_ns for p in directory.rglob("*")}
    status, _, err = _train(directory, "--keep", "2", steps=6)
    assert status == 2 and "already holds 2 commit record(s)" in err, err
    assert {p: p.stat().st_mtime_ns for p in directory.rglob("*")} == before


def test_overwrite_starts_afresh_and_resume_strict_refuses_an_empty_directory(
        tmp_path: Path) -> None:
    directory = tmp_path / "run"
    _, first, _ = _train(directory)
    status, again, err = _train(directory, "--overwrite")
    assert status == 0 and again == first and "removed COMMITTED-00000004.json" in err
    status, _, err = _train(tmp_path / "empty", "--resume-strict")
    assert status == 2 and "nothing to resume" in err, err


def test_the_single_process_commands_directory_and_the_other_trees_are_refused(
        tmp_path: Path) -> None:
    single = tmp_path / "single"
    status, _, _ = _train(single, world_size=1)
    assert status == 0 and any(p.name.startswith("ckpt-") for p in single.iterdir())
    status, _, err = _train(single, "--resume")
    assert status == 2 and "single-process checkpoints" in err and "--world-size 1" in err
    ranks = tmp_path / "ranks"
    assert _train(ranks)[0] == 0
    status, _, err = _train(ranks, world_size=1)  # and the other way round
    assert status == 2 and "holds commit records" in err, err
    status, lines, err = _train(ranks, "--resume", steps=6, world_size=1)  # on one rank
    assert status == 0 and lines[0].startswith("step 5 ") and "resharded to 1" in err, err
    before = sorted(p.name for p in ranks.iterdir())
    status, _, err = _train(ranks, "--resume", impl="torch")  # refused before any rank starts
    assert status == 2 and "payload 'npy-records' (--impl reference's)" in err, err
    assert sorted(p.name for p in ranks.iterdir()) == before


def test_resume_refuses_a_changed_configuration_naming_the_field(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    assert _train(directory)[0] == 0
    status, _, err = _train(directory, "--resume", "--seed", "7", steps=6)
    assert status == 2 and "seed" in err, err


def test_a_killed_saves_directory_is_removed_and_a_resume_at_another_size_says_it_resharded(
        tmp_path: Path) -> None:
    """A step directory no record names (made here: a save that did not finish) is removed
    with a line saying so; the resume at 3 ranks of a 2-rank commit names both sizes."""
    directory = tmp_path / "run"
    assert _train(directory)[0] == 0
    ckc.step_dir(directory, 6).mkdir()
    (ckc.step_dir(directory, 6) / "rank-0.ckpt").write_bytes(b"torn")
    status, lines, err = _train(directory, "--resume", steps=6, world_size=3)
    assert status == 0 and lines[0].startswith("step 5 "), lines
    assert "removed step-00000006" in err and "resharded to 3" in err, err
    assert ckc.read_record(ckc.record_path(directory, 6)).world_size == 3


def test_the_default_world_size_is_the_single_process_run_unchanged(tmp_path: Path) -> None:
    """--world-size 1 and no --world-size are the same run; the default schedule is still
    cosine there (the N-rank runs' constant lr is theirs only)."""
    digests = []
    for i, options in enumerate([(), ("--world-size", "1"), ("--schedule", "cosine")]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(["train", "--impl", "reference", "--steps", "3", "--checkpoint-dir",
                         str(tmp_path / str(i)), "--quiet", *options]) == 0
        digests.append(out.getvalue().strip())
    assert len(set(digests)) == 1, digests
