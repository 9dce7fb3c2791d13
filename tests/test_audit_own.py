"""`python -m parity audit` on what this project's own `python -m parity train` writes, run
through the real command in both trees: a single-process run folder and its checkpoint
file, an N-rank run folder (--world-size 3 reference, 2 torch), its step folders, a rank
file, a step whose commit record never landed. Each verdict "exact resume possible" is
held to the truth: the project's --resume from that very checkpoint ends with the
uninterrupted run's `state-sha256:` line.

Cost: each tree trains once (4 steps, a checkpoint every 2) and resumes once; the torch
N-rank run launches 2 gloo processes twice (about 5 s each).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from parity.lab.audit_recognize import DISABLED, INCOMPLETE, MISSING, NOT_NEEDED, PRESENT
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main

STEPS, EVERY = 4, 2
OPTIONS = ("--precision", "fp16", "--dropout", "0.1", "--checkpoint-every", str(EVERY))
REQUIRED_PRESENT = ("model", "optimizer", "scaler", "data position", "epoch", "global step")


@dataclass(frozen=True)
class Run:
    impl: str
    world_size: int  # 1: the single-process command
    directory: Path
    digest: str  # the uninterrupted run's state-sha256

    @property
    def rng(self) -> str:
        return "torch CPU RNG" if self.impl == "torch" else "numpy RNG"


def train(impl: str, directory: Path, world_size: int, *options: str,
          resumed_at: int | None = None) -> str:
    """The digest (the last line's state-sha256) of the command run here; fails unless 0,
    or unless it says it resumed at step `resumed_at` (where given)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["train", "--impl", impl, "--steps", str(STEPS), "--checkpoint-dir",
                       str(directory), "--world-size", str(world_size), "--quiet", *OPTIONS,
                       *options])
    lines = out.getvalue().strip().splitlines()
    assert status == EXIT_OK and lines[-1].startswith("state-sha256: "), (status, lines,
                                                                          err.getvalue())
    if resumed_at is not None:  # guard: a fresh run would end with the same digest
        assert f" at step {resumed_at}" in err.getvalue() and "resumed from" in err.getvalue(), \
            err.getvalue()
    return lines[-1].removeprefix("state-sha256: ")


def audit(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    """(exit status, the --json object (stdout is that object alone), stderr)."""
    status = main(["audit", str(target), "--json"])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out else {}), err


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["item"]: r for r in report["rows"]}


RUNS: dict[tuple[str, int], Run] = {}  # each trained once for the module's tests
SINGLE, RANKS = [("reference", 1), ("torch", 1)], [("reference", 3), ("torch", 2)]


def _trained(key: tuple[str, int], factory: pytest.TempPathFactory) -> Run:
    if key not in RUNS:
        impl, ws = key
        directory = factory.mktemp(f"{impl}-{ws}") / "run"
        RUNS[key] = Run(impl, ws, directory, train(impl, directory, ws))
    return RUNS[key]


@pytest.fixture(params=SINGLE + RANKS, ids=lambda p: f"{p[0]}-{p[1]}")
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _trained(request.param, tmp_path_factory)


@pytest.fixture(params=RANKS, ids=lambda p: f"{p[0]}-{p[1]}")
def ranked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _trained(request.param, tmp_path_factory)


def _newest(run: Run) -> Path:
    """The newest checkpoint the run wrote: its last ckpt file, or its last step folder."""
    name = f"ckpt-{STEPS:08d}.ckpt" if run.world_size == 1 else f"step-{STEPS:08d}"
    return run.directory / name


def test_the_run_folder_and_its_newest_checkpoint_are_exact(
        run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """The run folder (its newest checkpoint) and that checkpoint itself: exit 0, every entry
    the resume reads present, the tree's generator among them."""
    for target in (run.directory, _newest(run)):
        status, report, err = audit(target, capsys)
        assert (status, report["exact"], err) == (EXIT_OK, True, ""), (target, report)
        assert report["kind"].startswith("mirrortrain"), report["kind"]
        assert report["verdict"] == "exact resume possible"
        r = rows(report)
        for item in (*REQUIRED_PRESENT, run.rng):
            assert (r[item]["status"], r[item]["need"]) == (PRESENT, "required"), (item, r)
        other = r["torch CPU RNG" if run.impl == "reference" else "numpy RNG"]
        assert other["need"] != "required", other
    if run.world_size > 1:
        assert f"{run.world_size}-rank run folder" in audit(run.directory, capsys)[1]["kind"]
        assert f"step-{STEPS:08d}" in report["kind"] and "committed" in report["kind"]
        assert r["optimizer step counts"]["status"] == r["scheduler"]["status"] == NOT_NEEDED
        if run.impl == "reference":
            assert r["global step"]["detail"].startswith(f"step = {STEPS}, skipped = ")


def test_a_rank_file_is_one_of_n_shards_and_no_resumable_checkpoint(
        ranked: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """NOTE [ A rank file alone is no resumable checkpoint ] in parity/lab/audit_own.py: exit
    1, naming the shard and its committed step; a reference rank file's rows say what it
    holds (the model too), its stream that rank's alone."""
    run = ranked
    name = "rank-1.ckpt" if run.impl == "reference" else "__1_0.distcp"
    status, report, err = audit(_newest(run) / name, capsys)
    assert (status, report["exact"], err) == (EXIT_FAILED, False, ""), report
    assert report["refused"].startswith(f"one of {run.world_size} shards (rank 1's file of "
                                        f"committed step {STEPS})"), report["refused"]
    assert "whole committed step" in report["refused"]
    assert report["verdict"] == f"exact resume impossible: {report['refused']}"
    if run.impl == "reference":
        r = rows(report)
        assert all(r[i]["status"] == PRESENT for i in (*REQUIRED_PRESENT, run.rng)), r
        assert r[run.rng]["where"] == "rng/rank1"
        assert r[run.rng]["detail"].startswith("rank 1's stream only; the other 2 ranks'")
    else:  # which entries a DCP rank file holds only the .metadata says
        assert report["rows"] == [] and any(".metadata" in f for f in report["flags"])


def test_a_save_without_its_record_is_uncommitted_and_resume_takes_the_step_before(
        run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The newest save as a kill before its commit record leaves it (its record removed; its
    single-process twin: the newest file removed): that step is named uncommitted (exit 1),
    the run folder's audit takes the step before (exit 0), and --resume from there ends with
    the uninterrupted run's digest."""
    copy = tmp_path / "run"
    shutil.copytree(run.directory, copy)
    if run.world_size == 1:
        (copy / f"ckpt-{STEPS:08d}.ckpt").unlink()
        newest = f"ckpt-{EVERY:08d}.ckpt"
    else:
        (copy / f"COMMITTED-{STEPS:08d}.json").unlink()
        newest = f"step-{EVERY:08d}"
        status, report, _ = audit(copy / f"step-{STEPS:08d}", capsys)
        assert (status, report["exact"]) == (EXIT_FAILED, False)
        assert report["kind"].endswith("uncommitted")
        assert report["refused"].startswith(f"step-{STEPS:08d} is uncommitted: no "
                                            f"COMMITTED-{STEPS:08d}.json names it")
        assert all(rows(report)[i]["status"] in (PRESENT, DISABLED) for i in REQUIRED_PRESENT)
    status, report, _ = audit(copy, capsys)
    assert (status, report["exact"]) == (EXIT_OK, True), report
    assert newest in report["kind"]
    if run.world_size > 1:
        assert any(f.startswith(f"step-{STEPS:08d}: uncommitted") for f in report["flags"])
    assert train(run.impl, copy, run.world_size, "--resume", resumed_at=EVERY) == run.digest


def test_a_step_whose_file_changed_is_damage_and_the_run_folder_passes_over_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rank file changed after its commit: the step folder's audit is one line, exit 2
    (the SHA-256 the record holds); the run folder's takes the step before, the one the
    resume's own choice (ckpt.commit.newest) takes."""
    from ckpt import commit as ckc

    directory = tmp_path / "run"
    train("reference", directory, 3)
    rank = directory / f"step-{STEPS:08d}" / "rank-2.ckpt"
    raw = bytearray(rank.read_bytes())
    raw[-1] ^= 1
    rank.write_bytes(bytes(raw))
    status, report, err = audit(rank.parent, capsys)
    assert (status, report) == (EXIT_USAGE, {}) and err.count("\n") == 1, err
    assert "rank-2.ckpt's SHA-256 does not match the commit record" in err
    status, report, _ = audit(directory, capsys)
    assert status == EXIT_OK and f"step-{EVERY:08d}" in report["kind"]
    assert any(f.startswith("passed over, as the resume does:") for f in report["flags"])
    assert ckc.newest(directory, "npy-records")[0].step == EVERY


@pytest.fixture(params=SINGLE, ids=lambda p: f"{p[0]}-{p[1]}")
def single(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _trained(request.param, tmp_path_factory)


def test_a_damaged_newest_file_is_passed_over_as_the_single_process_resume_does(
        single: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The newest ckpt file damaged (its last byte flipped): audited alone, one line and
    exit 2; its folder's audit takes the file before (exit 0), as --resume does, which ends
    with the uninterrupted run's digest."""
    copy = tmp_path / "run"
    shutil.copytree(single.directory, copy)
    newest = copy / f"ckpt-{STEPS:08d}.ckpt"
    raw = bytearray(newest.read_bytes())
    raw[-1] ^= 1
    newest.write_bytes(bytes(raw))
    status, report, err = audit(newest, capsys)
    assert (status, report) == (EXIT_USAGE, {}) and err.count("\n") == 1, err
    status, report, _ = audit(copy, capsys)
    assert (status, report["exact"]) == (EXIT_OK, True), report
    assert report["kind"].endswith(f"that verifies: ckpt-{EVERY:08d}.ckpt"), report["kind"]
    assert any(f.startswith("passed over, as the resume does:") for f in report["flags"])
    assert train(single.impl, copy, 1, "--resume", resumed_at=EVERY) == single.digest


# (key, the row it belongs to, the rank whose state lacks it): the global entries are read
# from rank 0's state only (parity/lab/audit_ranks.py's table)
TABLE = [("model/0.weight", "model", 1), ("optim/momentum/0", "optimizer", 1),
         ("scaler/scale", "scaler", 1), ("scaler/growth_tracker", "scaler", 2),
         ("rng/rank1", "numpy RNG", 1), ("data/position", "data position", 0),
         ("data/epoch", "data position", 0), ("step", "global step", 0),
         ("skipped", "global step", 0)]


def forged(tmp_path: Path, key: str, rank: int) -> tuple[Path, Path]:
    """(a real 3-rank reference run, a copy of its newest step committed again by
    reference/sharded_ckpt.py with `rank`'s state lacking `key`), both of one run folder's
    layout."""
    from ckpt import commit as ckc
    from reference import resume, sharded_ckpt

    source = tmp_path / "run"
    train("reference", source, 3)
    step = source / f"step-{STEPS:08d}"
    states = [resume.load_checkpoint(step / f"rank-{r}.ckpt") for r in range(3)]
    del states[rank][key]
    config = json.loads((step / ckc.CONFIG).read_text())
    sharded_ckpt.save_sharded(tmp_path / "forged", STEPS, states, config=config)
    return source, tmp_path / "forged"


@pytest.mark.parametrize(("key", "item", "rank"), TABLE)
def test_a_committed_step_missing_one_entry_names_exactly_its_row(
        key: str, item: str, rank: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A step committed with one rank's state lacking one entry the resume reads: that row,
    and no other required one, is incomplete, and the verdict names it."""
    _, folder = forged(tmp_path, key, rank)
    status, report, _ = audit(folder, capsys)
    gaps = {r["item"]: r for r in report["rows"]
            if r["need"] == "required" and r["status"] not in (PRESENT, DISABLED)}
    also = {"data/epoch": ["epoch"]}.get(key, [])
    assert (status, sorted(gaps)) == (EXIT_FAILED, sorted([item, *also])), report
    assert gaps[item]["status"] in (INCOMPLETE, MISSING)
    assert gaps[item]["detail"] == f"rank {rank} lacks {key}"
    named = report["verdict"].removeprefix("exact resume impossible: ")
    assert named != report["verdict"] and item in named, named


def test_a_global_entry_only_rank_0_holds_is_enough_and_resumes_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's resume reads the data position and the step from rank 0's state: a
    step whose rank 1 lacks them is exact (exit 0), and resuming it to step 6 ends with the
    digest of resuming the step as it was saved."""
    source, folder = forged(tmp_path, "data/position", 1)
    state = forged(tmp_path / "b", "step", 2)[1]
    for target in (folder, state):
        status, report, _ = audit(target, capsys)
        assert (status, report["verdict"]) == (EXIT_OK, "exact resume possible"), report
    six = ("--steps", str(STEPS + EVERY), "--resume")
    expected = train("reference", source, 3, *six, resumed_at=STEPS)
    assert train("reference", folder, 3, *six, resumed_at=STEPS) == expected
