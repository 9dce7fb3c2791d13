"""ranks.launch's contract when a rank fails: the whole launch ends with one DDPError naming
the rank and how it failed, and no process outlives the call (a rank that raises, a rank
SIGKILLed, a hung peer: its partners time out in all_reduce, and the launch kills it). Bad
input is refused before anything starts. The launcher's old path, torch_impl.ddp, still
gives it, with a DeprecationWarning.
"""

from __future__ import annotations

import time

import pytest

from common.train_config import TrainConfig

ranks = pytest.importorskip("ranks")
ddp_jobs = pytest.importorskip("torch_impl.ddp_jobs")


def _launch_fails(jobs: list[dict], world_size: int, **kwargs: float) -> tuple[str, float]:
    """The DDPError's message and the seconds the launch took; checks nothing is left."""
    import multiprocessing

    start = time.monotonic()
    with pytest.raises(ranks.DDPError) as failure:
        ranks.launch(jobs, world_size, **kwargs)
    assert multiprocessing.active_children() == []  # every rank was joined
    return str(failure.value), time.monotonic() - start


def test_a_rank_that_raises_ends_the_launch_naming_it() -> None:
    message, _ = _launch_fails([ranks.fault_job(1, "raise", 2)], 2)
    assert message.startswith("ddp: rank 1 failed: ValueError: rank 1 raises on purpose")


def test_a_rank_killed_by_sigkill_ends_the_launch_naming_it() -> None:
    message, seconds = _launch_fails([ranks.fault_job(0, "kill", 3)], 3, collective_timeout=60.0)
    assert message.startswith("ddp: rank 0 was killed by SIGKILL"), message
    assert seconds < 30.0  # its partners did not wait out their 60 s timeout


@pytest.mark.slow
def test_a_hung_rank_ends_the_launch_when_its_partners_time_out() -> None:
    message, seconds = _launch_fails([ranks.fault_job(1, "hang", 2)], 2, collective_timeout=3.0)
    assert "rank 0 failed" in message and "ranks [1] were still running" in message, message
    assert seconds < 30.0


@pytest.mark.slow
def test_a_hung_rank_in_a_subgroup_ends_the_launch_as_soon() -> None:
    """A 2-rank job on a 3-rank launch runs on a subgroup, with the same collective timeout."""
    message, seconds = _launch_fails([ranks.fault_job(1, "hang", 2)], 3, collective_timeout=3.0)
    assert "rank 0 failed" in message and "ranks [1] were still running" in message, message
    assert seconds < 30.0


@pytest.mark.slow
def test_a_launch_past_its_deadline_is_killed() -> None:
    message, seconds = _launch_fails([ranks.fault_job(1, "hang", 2)], 2, timeout=4.0,
                                     collective_timeout=600.0)
    assert message.startswith("ddp: ranks [0, 1] still running after 4 s"), message
    assert seconds < 30.0


def test_bad_jobs_are_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="world_size 2 must be >= 1 and >= every job's"):
        ranks.launch([ddp_jobs.allreduce_job("float32", 4, 0, 3)], 2)
    with pytest.raises(ValueError, match="backend must be"):
        ranks.launch([], 1, backend="mpi")
    with pytest.raises(ValueError, match="equal shards"):
        ddp_jobs.train_job(TrainConfig(optimizer="SGD", batch_size=10, num_samples=40), 1, 3)
    with pytest.raises(ValueError, match="how must be"):
        ranks.fault_job(0, "explode", 2)


def test_a_job_that_cannot_start_surfaces_its_own_error() -> None:
    """A job the forkserver cannot pickle fails in Process.start: that error is the one raised
    (not the finally clause's "can only join a started process"), and nothing is left."""
    import multiprocessing
    import pickle

    job = {**ranks.fault_job(0, "raise", 2), "unpicklable": lambda: None}
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)) as failure:
        ranks.launch([job], 2)
    assert "pickle" in str(failure.value).lower(), failure.value
    assert multiprocessing.active_children() == []


def test_a_job_without_its_runner_is_refused_before_any_process_starts() -> None:
    """The launcher has no table of job kinds: a job names the module that runs it."""
    job = {k: v for k, v in ranks.fault_job(0, "raise", 2).items() if k != "runner"}
    with pytest.raises(ValueError, match="names its runner module"):
        ranks.launch([job], 2)


def test_the_old_import_path_gives_the_launcher_with_a_deprecation_warning() -> None:
    import torch_impl.ddp

    with pytest.warns(DeprecationWarning, match="torch_impl.ddp.launch is ranks.launch now"):
        from torch_impl.ddp import launch
    with pytest.warns(DeprecationWarning, match="DDPError is ranks.DDPError"):
        from torch_impl.ddp import DDPError
    assert (launch, DDPError) == (ranks.launch, ranks.DDPError)
    with pytest.raises(AttributeError, match="no attribute 'lunch'"):
        torch_impl.ddp.lunch  # noqa: B018
