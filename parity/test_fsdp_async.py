"""Asynchronous checkpoints of the GPT's FSDP2 run (claim fsdp.gpt_async_resume): `train
--world-size N --model gpt --parallel fsdp --async-save` saves through the DDP run's
AsyncSaver (NOTE [ An async save commits after its data is durable ] in
reference/async_ckpt.py). get_state_dict's DTensors alias the live shards, which the next
AdamW step overwrites in place: what is held is that a commit read back is the state as it
was at its save although the shards moved on (or were overwritten with NaN) before the
write began, that the record follows every rank's write and the run returns after its last
commit, that a stopped async run resumes to the uninterrupted digest (the same N, and on 3
ranks after 2 ranks' commit), and that a failed or killed write, or a coordinator stopped
between the data and the record, leaves the previous commit to resume from.

Default: one launch of 2 gloo ranks (fp16 with its scaler, dropout, 4 steps, a commit every
2: the sync run, the held writes, the stop at 2 and the resume), the reference's command in
this process (its reshard and faults too), pinned staging refused in one line. Slow:
torch's reshard 2 -> 3, its kills, and its command against the sync command's digest.
Driver: parity/drivers/fsdp_async.py.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt import commit as ckc
from ckpt import commit_policy
from parity.compare import assert_claim
from parity.drivers import fsdp_async as fa
from parity.drivers import fsdp_gpt as drv
from parity.lab.cli import main
from torch_impl import fsdp as tfsdp

if not tfsdp.RULE_STATED:
    pytest.skip(tfsdp.NOT_STATED, allow_module_level=True)
torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")

CLAIM = "fsdp.gpt_async_resume"
STEPS, EVERY = 4, 2
DELAY = 0.3  # seconds each write of the stopped run is held: its last save returns at once
OPTIONS = (*drv.RESUME_FP16_OPTIONS, "--async-save")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    """(the folder, results[rank][job]) of the default launch, 2 ranks: the sync run to 4;
    the held run (saves at 2 and 4, each write held until the shards moved on); the stopped
    run (to its save at 2, the write delayed DELAY s); its resume to 4. Measured: 6.5 to 8.1 s
    (torch 2.13 CPU, 2 busy cores), about 2.5 s of it starting the ranks."""
    import ranks

    tmp = tmp_path_factory.mktemp("fsdp_async")
    jobs = [fa.job(tmp / "sync", 2, STEPS, EVERY, None, mode=None),
            fa.job(tmp / "held", 2, STEPS, EVERY, None, gate="next_step"),
            fa.job(tmp / "stopped", 2, EVERY, EVERY, None, gate=DELAY),
            fa.job(tmp / "stopped", 2, STEPS, EVERY, EVERY)]
    return tmp, ranks.launch(jobs, 2, timeout=300)


def _assert_state(got: dict[str, Any], want: dict[str, Any], context: str) -> None:
    assert set(want) <= set(got), context
    for k in sorted(want):
        assert_claim(CLAIM, actual=got[k].numpy(), expected=want[k].numpy(),
                     context=f"{context}: {k}")


def _events(result: dict, what: str) -> dict[int, tuple[float, float]]:
    return {step: (t0, t1) for kind, step, t0, t1 in result["events"] if kind == what}


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)


def test_an_fsdp_commit_holds_the_steps_shards_though_they_changed_before_its_write(
        launched: tuple[Path, list[list[dict]]]) -> None:
    """Each rank's writes of steps 2 and 4 began only after its shards moved on (step 3's
    AdamW; NaN written over the live DTensors after the last save), and each commit read
    back is every rank's state as handed to the save: its rows, AdamW's, its stream."""
    tmp, results = launched
    for rank in range(2):
        held = results[rank][1]
        write = _events(held, "write")
        assert write[EVERY][0] >= held["ended"][EVERY + 1], "guard: step 3 ran first"
        assert held["nan"] == [True], "guard: get_state_dict's DTensors alias the shards"
        for step in (EVERY, STEPS):
            _assert_state(fa.read_back(tmp / "held", step, rank, 2), held["saved"][step],
                          f"rank {rank} step {step}")


def test_the_fsdp_record_follows_every_ranks_write_and_the_run_its_last_commit(
        launched: tuple[Path, list[list[dict]]]) -> None:
    """Rank 0's commit of each step ends after both ranks' writes of it ended, every record
    lists both ranks' files; the stopped run, its last write delayed, returned after its
    commit, on every rank."""
    tmp, results = launched
    ends = [_events(results[r][1], "write") for r in range(2)]
    for step, (_, end) in _events(results[0][1], "commit").items():
        assert end >= max(e[step][1] for e in ends), step
        record = ckc.read_record(ckc.record_path(tmp / "held", step))
        assert {f.name for f in record.files} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    for rank in range(2):
        stopped = results[rank][2]
        write = _events(stopped, "write")[EVERY]
        assert write[1] - write[0] >= 0 and stopped["returned"] >= write[1]
        assert stopped["records"] == [f"COMMITTED-{EVERY:08d}.json"], stopped["records"]


def test_a_stopped_async_fsdp_run_resumes_to_the_uninterrupted_digest(
        launched: tuple[Path, list[list[dict]]]) -> None:
    """Stopped at its async commit of step 2 and resumed (async) to 4: the digest of the
    sync run that never stopped, on every rank."""
    _, results = launched
    whole, stopped, resumed = (results[0][j] for j in (0, 2, 3))
    assert stopped["step"] == EVERY and stopped["digest"] != whole["digest"], "guard"
    for rank in range(2):
        assert_claim(CLAIM, actual=_hex(results[rank][3]["digest"]),
                     expected=_hex(whole["digest"]), context=f"torch rank {rank}")
    assert f"COMMITTED-{STEPS:08d}.json" in resumed["records"], resumed["records"]



@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_pinned_fsdp_staging_is_refused_where_it_cannot_run_in_one_line(
        tmp_path: Path, impl: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--parallel fsdp --async-save pinned`: refused by the reference always and by torch
    without CUDA, as under DDP (exit 2, one line, nothing created); torch with CUDA runs it."""
    if impl == "torch" and torch.cuda.is_available():
        pytest.skip("CUDA is present: pinned staging runs")
    status = main(["train", "--impl", impl, "--world-size", "2", "--steps", "2",
                   "--checkpoint-dir", str(tmp_path / "run"), *drv.RESUME_OPTIONS,
                   "--async-save", "pinned"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and "--async-save pinned" in err, err
    assert not (tmp_path / "run").exists()

# ------------------------------------------------------------------------- the reference

def _command(directory: Path, world_size: int, steps: int, *extra: str,
             options: tuple[str, ...] = OPTIONS) -> tuple[int, list[str], str]:
    """`train --impl reference --parallel fsdp` run here: (status, stdout lines, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["train", "--impl", "reference", "--world-size", str(world_size), "--steps",
            str(steps), "--checkpoint-dir", str(directory), *options, *extra]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([*argv, *(["--resume"] if directory.exists() else [])])
    return status, out.getvalue().strip().splitlines(), err.getvalue()


def _digest(directory: Path, world_size: int, steps: int, *extra: str,
            options: tuple[str, ...] = OPTIONS) -> list[str]:
    status, lines, err = _command(directory, world_size, steps, *extra, options=options)
    assert status == 0 and lines[-1].startswith("state-sha256: "), err
    return lines


def test_reference_async_fsdp_commits_hold_the_step_and_resume_to_the_sync_digest(
        tmp_path: Path) -> None:
    """The reference's 2 simulated ranks: the async run's step lines and digest are the sync
    run's; with each write held until the shards moved on (the last: NaN over them), every
    commit read back is each rank's state as saved; stopped at its commit of step 2 (the
    write delayed, the command returning after the commit) and resumed: the sync digest."""
    from reference import resume

    sync = _digest(tmp_path / "sync", 2, STEPS, options=drv.RESUME_FP16_OPTIONS)
    assert _digest(tmp_path / "async", 2, STEPS) == sync, "the async run's lines"
    with fa.observed("next_step", STEPS) as seen:
        _digest(tmp_path / "held", 2, STEPS)
    write = _events({"events": seen["savers"][0].events}, "write")
    assert write[EVERY][0] >= seen["ended"][EVERY + 1], "guard: step 3 ran first"
    for step in (EVERY, STEPS):
        record = ckc.read_record(ckc.record_path(tmp_path / "held", step))
        ckc.verify(record)
        for rank, want in enumerate(seen["saved"][step]):
            got = resume.load_checkpoint(record.directory / f"rank-{rank}.ckpt")
            assert got.pop(f"rng/rank{rank}") == want[f"rng/rank{rank}"], "its stream"
            for k in sorted(set(want) - {f"rng/rank{rank}"}):
                assert_claim(CLAIM, actual=np.asarray(got[k]), expected=want[k],
                             context=f"reference rank {rank} step {step}: {k}")
    with fa.observed(DELAY, STEPS):
        _digest(tmp_path / "stopped", 2, EVERY)
        assert [p.name for p in ckc.records(tmp_path / "stopped")] == [
            f"COMMITTED-{EVERY:08d}.json"], "the command returned before its last commit"
    lines = _digest(tmp_path / "stopped", 2, STEPS)
    assert lines[0].startswith(f"step {EVERY + 1} "), "guard: it resumed"
    assert_claim(CLAIM, actual=_hex(lines[-1].split()[-1]), expected=_hex(sync[-1].split()[-1]),
                 context="reference, stopped at 2")


def test_reference_async_fsdp_resumed_on_three_ranks_stops_and_resumes_to_its_digest(
        tmp_path: Path) -> None:
    """2 ranks' async commit of step 2 resumed on 3 (the rows cut anew) to 4, and the same
    commit resumed on 3 to an async commit at 3, stopped there and resumed to 4: the same
    digest at 3 ranks."""
    went_on, stopped = tmp_path / "went_on", tmp_path / "stopped"
    _digest(went_on, 2, EVERY)
    shutil.copytree(went_on, stopped)
    whole = _digest(went_on, 3, STEPS)
    _digest(stopped, 3, EVERY + 1, "--checkpoint-every", "1")
    lines = _digest(stopped, 3, STEPS, "--checkpoint-every", "1")
    assert lines[0].startswith(f"step {STEPS} "), "guard: resumed at 3 ranks' commit"
    assert ckc.newest(stopped, "npy-records")[0].world_size == 3
    assert_claim(CLAIM, actual=_hex(lines[-1].split()[-1]), expected=_hex(whole[-1].split()[-1]),
                 context="reference, 2 -> 3 ranks, stopped at 3")


@pytest.mark.parametrize("where", ["rank 1's write", "the record"])
def test_reference_a_failed_async_fsdp_save_leaves_step_2_to_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Step 4's save fails in rank 1's write (a full disk, seeded), or after every rank's
    data before the record (the coordinator stopped there): the command ends in one line,
    exit 1; step 2 is the newest commit and resumes to the sync run's digest."""
    from reference import async_ckpt as ra

    sync = _digest(tmp_path / "sync", 2, STEPS, options=drv.RESUME_FP16_OPTIONS)
    directory = tmp_path / "failed"
    write, commit = ra.resume.save_checkpoint, ra.ckc.commit

    def full_disk(path: Path, state: dict) -> None:
        if path.parent.name == f"step-{STEPS:08d}" and path.name == "rank-1.ckpt":
            raise OSError(28, "No space left on device (seeded)")
        write(path, state)

    def stopped(parent: Any, step: int, *args: Any) -> Any:
        if step == STEPS:
            raise RuntimeError("the coordinator stopped before the record (seeded)")
        return commit(parent, step, *args)

    with monkeypatch.context() as patch:
        if where == "rank 1's write":
            patch.setattr(ra.resume, "save_checkpoint", full_disk)
        else:
            patch.setattr(ra.ckc, "commit", stopped)
        status, _, err = _command(directory, 2, STEPS, "--quiet")
    assert status == 1 and err.strip().splitlines()[-1].startswith(
        f"train: async save of step {STEPS} failed: "), err
    assert [p.name for p in ckc.records(directory)] == [f"COMMITTED-{EVERY:08d}.json"]
    assert ckc.uncommitted(directory) == [ckc.step_dir(directory, STEPS)]
    if where == "the record":
        names = {p.name for p in ckc.step_dir(directory, STEPS).iterdir()}
        assert {"rank-0.ckpt", "rank-1.ckpt"} <= names, names
    lines = _digest(directory, 2, STEPS)
    assert lines[0].startswith(f"step {EVERY + 1} "), "guard: resumed from step 2"
    assert_claim(CLAIM, actual=_hex(lines[-1].split()[-1]), expected=_hex(sync[-1].split()[-1]),
                 context=f"reference, {where} failed at step 4")


# ------------------------------------------------------------------------- slow (torch)

@pytest.mark.slow
def test_torch_async_fsdp_resumed_on_three_ranks_stops_and_resumes_to_its_digest(
        tmp_path: Path) -> None:
    """torch: 2 ranks' async commit of step 2 resumed on 3 (DCP's planner cutting the rows
    anew) to 4, and the same commit resumed on 3 to an async commit at 3, stopped there and
    resumed to 4: the same digest on every rank. Measured: 11.5 s (two launches, 2 busy
    cores)."""
    import ranks

    went_on, stopped = tmp_path / "went_on", tmp_path / "stopped"
    ranks.launch([fa.job(went_on, 2, EVERY, EVERY, None)], 2, timeout=300)
    shutil.copytree(went_on, stopped)
    results = ranks.launch([fa.job(went_on, 3, STEPS, EVERY, EVERY),
                            fa.job(stopped, 3, EVERY + 1, 1, EVERY),
                            fa.job(stopped, 3, STEPS, 1, EVERY + 1)], 3, timeout=300)
    assert results[0][1]["step"] == EVERY + 1 and results[0][2]["step"] == STEPS
    assert ckc.newest(stopped, "dcp")[0].world_size == 3
    for rank in range(3):
        assert_claim(CLAIM, actual=_hex(results[rank][2]["digest"]),
                     expected=_hex(results[rank][0]["digest"]),
                     context=f"torch, 2 -> 3 ranks, stopped at 3, rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize(("what", "victim"), [("kill_in_write", 1), ("kill_before_commit", 0)])
def test_torch_an_fsdp_rank_killed_in_an_async_save_leaves_step_2_to_resume(
        launched: tuple[Path, list[list[dict]]], tmp_path: Path, what: str,
        victim: int) -> None:
    """torch: rank 1 SIGKILLed in its background write of step 4, or rank 0 after every
    rank's data before the record: the launch ends in one line naming it; step 2 is the
    newest commit, step 4 holds no record, and the resume ends with the sync run's digest.
    Measured: 3.4 to 5.8 s (two launches)."""
    import ranks

    directory = tmp_path / "killed"
    job = fa.job(directory, 2, STEPS, EVERY, None, fault=(what, victim, STEPS))
    with pytest.raises(ranks.DDPError) as error:
        ranks.launch([job], 2, timeout=120)
    assert f"rank {victim} was killed by SIGKILL" in str(error.value), error.value
    assert "\n" not in str(error.value)
    assert [p.name for p in ckc.records(directory)] == [f"COMMITTED-{EVERY:08d}.json"]
    assert ckc.uncommitted(directory) == [ckc.step_dir(directory, STEPS)]
    if what == "kill_before_commit":
        names = {p.name for p in ckc.step_dir(directory, STEPS).iterdir()}
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= names, names
    removed: list[str] = []  # the command's start: the unfinished step directory goes
    commit_policy.start(directory, "dcp", resume=True, overwrite=False, strict=False,
                        notify=removed.append)
    assert len(removed) == 1 and f"step-{STEPS:08d}" in removed[0], removed
    resumed = ranks.launch([fa.job(directory, 2, STEPS, EVERY, EVERY)], 2, timeout=300)
    whole = launched[1][0][0]
    for rank in range(2):
        assert_claim(CLAIM, actual=_hex(resumed[rank][0]["digest"]),
                     expected=_hex(whole["digest"]), context=f"torch, {what}, rank {rank}")


@pytest.mark.slow
def test_torch_the_fsdp_command_saving_asynchronously_prints_the_sync_digest(
        tmp_path: Path) -> None:
    """`train --impl torch --parallel fsdp --async-save --keep 1`: the sync command's digest,
    and only the last commit kept (pruned after each commit). Measured: 6 s (two commands)."""
    def command(directory: Path, *extra: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = main(["train", "--impl", "torch", "--world-size", "2", "--steps",
                           str(STEPS), "--checkpoint-dir", str(directory), "--keep", "1",
                           *drv.RESUME_FP16_OPTIONS, *extra])
        assert status == 0
        return out.getvalue().strip().splitlines()[-1].split()[-1]

    sync, asynchronous = command(tmp_path / "sync"), command(tmp_path / "async", "--async-save")
    assert [p.name for p in ckc.records(tmp_path / "async")] == [f"COMMITTED-{STEPS:08d}.json"]
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == [
        f"COMMITTED-{STEPS:08d}.json", f"step-{STEPS:08d}"]
    assert_claim(CLAIM, actual=_hex(asynchronous), expected=_hex(sync), context="the command")
