"""Asynchronous sharded checkpoints that cannot tear (ddp.async_resume): dcp.async_save
stages copies (a commit holds its step's bits although the parameters changed before the
write began), the commit record comes only after every rank's data is durable, a save
asked for while the previous one writes waits for its commit, and a rank that dies, raises
or hangs in the write, or a coordinator killed before the record, leaves the previous
commit loadable and resumable to the uninterrupted bits. The reference's twin
(reference/async_ckpt.py): the same protocol with a background thread, the same checks.

Default cost: one launch of 2 gloo processes (uninterrupted, held writes, the resume from
them, overlapping saves: 3 to 6 s measured, torch 2.13 CPU, 2 busy cores), then for each of
the two kills and the raise a failing launch and a resume (under 1 s each, the forkserver
warm), and the reference's saves in this process: about 6 s in all. The hang is slow. The
`train --async-save` command: parity/test_ddp_async_cli.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from ckpt import commit as ckc
from parity.compare import assert_claim
from parity.drivers import ddp_ckpt as drv

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

CLAIM = "ddp.async_resume"
STEPS, EVERY, SAVE_AT = 6, 2, 4
DELAY = 0.2  # seconds each write of the overlapping run is held: its steps take ~5 ms


def _job(tmp: Path, name: str, steps: int, every: int, **kw: object) -> dict:
    from torch_impl import async_ckpt as ac

    return ac.async_job(drv.config(), steps, 2, str(tmp / name), every, **kw)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    """(the folder, results[rank][job]) of the default launch: uninterrupted to 6; saves at
    2 and 4 with each write held until the parameters changed; the resume from its step-4
    commit to 6; saves at every step of 4, each write delayed DELAY s."""
    import ranks

    tmp = tmp_path_factory.mktemp("ddp_async")
    jobs = [_job(tmp, "none", STEPS, STEPS + 1),
            _job(tmp, "held", SAVE_AT, EVERY, gate="next_step"),
            _job(tmp, "held", STEPS, STEPS + 1, resume=True),
            _job(tmp, "overlap", SAVE_AT, 1, gate=DELAY)]
    return tmp, ranks.launch(jobs, 2, timeout=120.0)


def load_step(directory: Path, step: int, like: dict) -> dict:
    """The commit of `step` in `directory`, verified, loaded here into zeros like `like`."""
    import torch.distributed.checkpoint as dcp

    from torch_impl import sharded_ckpt as sc

    record = ckc.read_record(ckc.record_path(directory, step))
    ckc.verify(record)
    template = {k: torch.zeros_like(v) for k, v in like.items()}
    with sc.dcp_notices_ignored():
        dcp.load(template, storage_reader=dcp.FileSystemReader(record.directory),
                 **sc.no_dist_kwargs())
    return template


def _assert_states(got: dict, want: dict, context: str) -> None:
    assert sorted(got) == sorted(want), context
    for k in sorted(want):
        assert_claim(CLAIM, actual=got[k].numpy(), expected=want[k].numpy(),
                     context=f"{context}: {k}")


def _events(result: dict, what: str) -> dict[int, tuple[float, float]]:
    return {step: (t0, t1) for kind, step, t0, t1 in result["events"] if kind == what}


def test_a_commit_holds_the_steps_bits_though_the_parameters_changed_before_its_write(
        measured: tuple[Path, list[list[dict]]]) -> None:
    """Each rank's writes of steps 2 and 4 began only after its parameters moved on (step
    3; NaN written over them), and each commit loads the state as it was at its step."""
    tmp, results = measured
    for rank in range(2):
        held = results[rank][1]
        write, compute = _events(held, "write"), _events(held, "compute")
        assert write[2][0] >= compute[3][1], "guard: step 3 ran before step 2's write"
        assert all(torch.isnan(v).all() for k, v in held["final"].items()
                   if k.startswith("model/")), "guard: NaN over the parameters"
        for step in (EVERY, SAVE_AT):
            _assert_states(load_step(tmp / "held", step, held["saved"][step]),
                           held["saved"][step], f"rank {rank} step {step}")


def test_resumed_from_an_async_commit_ends_with_the_uninterrupted_bits(
        measured: tuple[Path, list[list[dict]]]) -> None:
    """The resume from the held run's step-4 commit ends at step 6 with the bits of the
    run that never saved, every rank."""
    _, results = measured
    for rank in range(2):
        resumed, whole = results[rank][2], results[rank][0]
        assert int(resumed["loaded"]["step"]) == SAVE_AT
        _assert_states(resumed["final"], whole["final"], f"rank {rank}")


def test_a_save_asked_for_while_the_previous_writes_waits_for_its_commit(
        measured: tuple[Path, list[list[dict]]]) -> None:
    """Saves every step with each write held DELAY s: step k + 1's save was asked for before
    step k committed, yet its staging and write began after that commit on every rank, and
    all four commits verify and load their step's bits."""
    tmp, results = measured
    for rank in range(2):
        run = results[rank][3]
        stage, write, commit = (_events(run, w) for w in ("stage", "write", "commit"))
        compute = _events(run, "compute")
        assert sorted(commit) == list(range(1, SAVE_AT + 1)), sorted(commit)
        for k in range(1, SAVE_AT):
            assert compute[k + 1][1] < commit[k][1], f"guard: save {k + 1} asked for early"
            assert stage[k + 1][0] >= commit[k][1], f"rank {rank}: staged {k + 1} too soon"
            assert write[k + 1][0] >= commit[k][1], f"rank {rank}: wrote {k + 1} too soon"
        for step in range(1, SAVE_AT + 1):
            _assert_states(load_step(tmp / "overlap", step, run["saved"][step]),
                           run["saved"][step], f"rank {rank} step {step}")
    starts = [min(t0 for t0, _ in _events(results[r][3], "write").values()) for r in (0, 1)]
    firsts = [_events(results[r][3], "commit")[1][1] for r in (0, 1)]
    assert max(starts) < min(firsts), "guard: the ranks' first writes overlap in time"


def test_the_commit_record_comes_after_every_ranks_write(
        measured: tuple[Path, list[list[dict]]]) -> None:
    """Rank 0's commit of every step ends after both ranks' writes of it ended (one clock:
    time.monotonic is the machine's), and every record lists both ranks' files."""
    tmp, results = measured
    for name, index in (("held", 1), ("overlap", 3)):
        ends = [_events(results[r][index], "write") for r in (0, 1)]
        commits = _events(results[0][index], "commit")
        for step, (_, end) in commits.items():
            assert end >= max(e[step][1] for e in ends), (name, step)
            record = ckc.read_record(ckc.record_path(tmp / name, step))
            assert {f.name for f in record.files} >= {"__0_0.distcp", "__1_0.distcp",
                                                      ".metadata"}


def test_pinned_staging_is_refused_without_cuda_in_one_line() -> None:
    """--async-save pinned needs CUDA: refused here with one line, or run where present."""
    from torch_impl import async_ckpt as ac

    if torch.cuda.is_available():
        pytest.skip("CUDA is present: pinned staging runs (test_pinned_staging_...)")
    why = ac.refusal("pinned")
    assert why is not None and "\n" not in why and "CUDA" in why
    assert ac.refusal("copy") is None


def test_pinned_staging_keeps_each_steps_bits(tmp_path: Path) -> None:
    """The held run with pinned staging (one page-locked buffer reused by every save)."""
    if not torch.cuda.is_available():
        pytest.skip("pinned staging needs CUDA (torch.cuda.is_available() is False)")
    import ranks

    results = ranks.launch([_job(tmp_path, "pinned", SAVE_AT, EVERY, gate="next_step",
                                 mode="pinned")], 2, timeout=120.0)
    for rank in range(2):
        held = results[rank][0]
        for step in (EVERY, SAVE_AT):
            _assert_states(load_step(tmp_path / "pinned", step, held["saved"][step]),
                           held["saved"][step], f"pinned rank {rank} step {step}")


# ----------------------------------------------------------------- the reference's twin

def _ref_states(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"model/w": rng.standard_normal((4, 3)), "step": np.int64(seed),
             f"rng/rank{r}": np.random.default_rng(r).bit_generator.state} for r in range(2)]


def test_reference_a_commit_holds_the_staged_bits_though_the_arrays_changed(
        tmp_path: Path) -> None:
    """reference AsyncSaver: the arrays overwritten with NaN after save returned and before
    the held write began; the commit loads the values they had."""
    from reference import async_ckpt as ra
    from reference import sharded_ckpt as rs

    released = threading.Event()
    saver = ra.AsyncSaver()
    states = _ref_states(2)
    want = [{k: np.array(v, copy=True) if k == "model/w" else v for k, v in s.items()}
            for s in states]
    saver.save(tmp_path, 2, states, gate=lambda: released.wait(10))
    for s in states:
        s["model/w"][...] = np.nan
    released.set()
    saver.close()
    events = {"events": saver.events}
    write, stage = _events(events, "write")[2], _events(events, "stage")[2]
    assert write[0] >= stage[1], "guard: the write began after save returned"
    record, loaded = rs.load_sharded(tmp_path, 2, 0)
    assert record.step == 2
    for r in range(2):
        assert_claim(CLAIM, actual=loaded[r]["model/w"], expected=want[r]["model/w"],
                     context=f"reference rank {r}")


def test_reference_a_save_asked_for_while_the_previous_writes_waits_for_its_commit(
        tmp_path: Path) -> None:
    """reference AsyncSaver: save 2 asked for while save 1's write is held; it starts after
    save 1's commit, and both commits verify and load their bits."""
    from reference import async_ckpt as ra
    from reference import resume

    saver = ra.AsyncSaver()
    first, second = _ref_states(1), _ref_states(2)
    saver.save(tmp_path, 1, first, gate=lambda: threading.Event().wait(DELAY))
    asked = ra.now()
    saver.save(tmp_path, 2, second)
    saver.close()
    commit, write = (_events({"events": saver.events}, w) for w in ("commit", "write"))
    assert asked < commit[1][1], "guard: save 2 was asked for before save 1 committed"
    assert write[2][0] >= commit[1][1], "save 2 wrote before save 1 committed"
    for step, states in ((1, first), (2, second)):
        record = ckc.read_record(ckc.record_path(tmp_path, step))
        ckc.verify(record)
        for r in range(2):
            got = resume.load_checkpoint(record.directory / f"rank-{r}.ckpt")
            assert_claim(CLAIM, actual=got["model/w"], expected=states[r]["model/w"],
                         context=f"reference step {step} rank {r}")


# ----------------------------------------------- faults (the hang is slow: its timeouts)

def _failed_launch(tmp: Path, fault: tuple[str, int, int], timeout: float = 20.0) -> str:
    """The held run's saves at 2 and 4 with `fault` at step 4's; the launch's error line."""
    import ranks

    job = _job(tmp, "faulted", SAVE_AT, EVERY, fault=fault, timeout=timeout)
    with pytest.raises(ranks.DDPError) as error:
        ranks.launch([job], 2, timeout=60.0, collective_timeout=timeout / 2)
    return str(error.value)


def _previous_intact_and_resumable(tmp: Path, measured: tuple[Path, list[list[dict]]]
                                   ) -> None:
    """Step 2 is the newest commit and loads the held run's step-2 bits; step 4 holds no
    record; a resume from step 2 ends at 6 with the uninterrupted bits."""
    import ranks

    _, results = measured
    directory = tmp / "faulted"
    assert [p.name for p in ckc.records(directory)] == [f"COMMITTED-{EVERY:08d}.json"]
    assert ckc.uncommitted(directory) == [ckc.step_dir(directory, SAVE_AT)]
    for rank in range(2):
        want = results[rank][1]["saved"][EVERY]
        _assert_states(load_step(directory, EVERY, want), want, f"step 2 rank {rank}")
    resumed = ranks.launch([_job(tmp, "faulted", STEPS, STEPS + 1, resume=True)], 2,
                           timeout=60.0)
    for rank in range(2):
        assert int(resumed[rank][0]["loaded"]["step"]) == EVERY
        _assert_states(resumed[rank][0]["final"], results[rank][0]["final"],
                       f"resumed rank {rank}")


def test_a_rank_killed_in_its_background_write_leaves_step_2_resumable(
        measured: tuple[Path, list[list[dict]]], tmp_path: Path) -> None:
    """Rank 1 SIGKILLed in the background write of step 4 (its main thread training on):
    the run ends with one line naming it; step 2 intact, resumed to the uninterrupted bits.
    Measured: 0.3 to 0.6 s (two launches, the forkserver warm)."""
    error = _failed_launch(tmp_path, ("kill_in_write", 1, SAVE_AT))
    assert "rank 1 was killed by SIGKILL" in error and "\n" not in error, error
    _previous_intact_and_resumable(tmp_path, measured)


def test_the_coordinator_killed_between_the_data_and_the_record_leaves_step_2_resumable(
        measured: tuple[Path, list[list[dict]]], tmp_path: Path) -> None:
    """Rank 0 SIGKILLed after both ranks' step-4 data and .metadata are durable and
    gathered, before the record: step 4's files are all there and are no checkpoint; step 2
    resumes to the uninterrupted bits. Measured: 0.3 to 0.6 s (two launches)."""
    error = _failed_launch(tmp_path, ("kill_before_commit", 0, SAVE_AT))
    assert "rank 0 was killed by SIGKILL" in error and "\n" not in error, error
    names = {p.name for p in ckc.step_dir(tmp_path / "faulted", SAVE_AT).iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= names, names
    _previous_intact_and_resumable(tmp_path, measured)


def test_a_rank_raising_in_its_background_write_ends_the_run_in_one_line(
        measured: tuple[Path, list[list[dict]]], tmp_path: Path) -> None:
    """Rank 1's write of step 4 raises: the run ends with one line naming the step, the
    rank and the error; step 2 resumes to the uninterrupted bits. Measured: 0.6 s."""
    error = _failed_launch(tmp_path, ("raise_in_write", 1, SAVE_AT))
    assert "async save of step 4" in error and "\n" not in error, error
    assert "rank 1: OSError: rank 1: the write failed on purpose" in error, error
    _previous_intact_and_resumable(tmp_path, measured)


@pytest.mark.slow
def test_a_rank_hanging_in_its_background_write_ends_the_run_at_its_timeout(
        measured: tuple[Path, list[list[dict]]], tmp_path: Path) -> None:
    """Rank 1's write of step 4 hangs: the peers' collectives time out and the run ends
    with one line naming the step (no record of step 4); step 2 resumes to the
    uninterrupted bits. Measured: 8.3 s (collective timeout 4 s, the saver's 8 s)."""
    error = _failed_launch(tmp_path, ("hang_in_write", 1, SAVE_AT), timeout=8.0)
    assert "async save of step 4" in error and "\n" not in error, error
    _previous_intact_and_resumable(tmp_path, measured)


# ------------------------------------------------------------ the command: train --async-save
