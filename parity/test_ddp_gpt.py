"""The GPT with AdamW on N ranks: DDP's bucket (ddp.gpt_buckets), its reduced gradients
(ddp.gpt_reduced_grads) and the AdamW step (ddp.gpt_adamw) against the reference's simulated
ranks replaying the torch ranks' local gradients; `train --world-size N --model gpt` stopped
or killed and resumed to the uninterrupted digest (ddp.gpt_resume); and the learning
control, the N-rank loss curve against one process's (ddp.gpt_loss_curve).

The default run makes ONE launch of 2 gloo processes (the compact GPT of the train command):
the replayed jobs in fp32 and fp16 (3 steps each), then the command's job three times
in a row (uninterrupted to step 6, stopped at 2, resumed to 6); the reference's command runs
here in this process. World sizes 3 and 4, recomputation, the kills, loader workers and the
60-step loss curve are slow. Driver: parity/drivers/ddp_gpt.py.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers import ddp_gpt as drv
from parity.drivers import ddp_train as kills
from parity.lab.cli import main

pytest.importorskip("torch.distributed.checkpoint")

PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT = ("fp32", "fp16")  # bf16 is in the slow runs at 3 and 4 ranks
Launch = tuple[list[dict], list[list[dict]]]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Path]:
    """The default launch (2 ranks): ((jobs, results[rank][job]), the resume jobs' folder).
    Measured: 3.5 to 7 s (torch 2.13 CPU, 2 busy cores), about 2 s of it starting the ranks;
    over the default suite's ~2 s, kept there as the one torch run of the GPT that sees a
    lost AdamW step count, scaler or schedule position (the kills are slow)."""
    import ranks

    tmp = tmp_path_factory.mktemp("ddp_gpt")
    jobs = drv.gpt_jobs(2, DEFAULT) + drv.resume_jobs(tmp, 2)
    return (jobs, ranks.launch(jobs, 2, timeout=300)), tmp


def _replayed(launch: Launch, precision: str) -> tuple[dict, int, drv.Replay]:
    jobs, results = launch
    index = next(i for i, j in enumerate(jobs)
                 if j["kind"] == "gpt" and j["config"]["precision"] == precision)
    return jobs[index], index, drv.replay(jobs[index], results, index)


def _check_step(launch: Launch, precision: str) -> None:
    """ddp.gpt_buckets, ddp.gpt_reduced_grads and ddp.gpt_adamw for one replayed job."""
    job, index, rp = _replayed(launch, precision)
    results, ws = launch[1], job["world_size"]
    for k in range(job["steps"]):
        torch_step = results[0][index]["steps"][k]
        assert_claim("ddp.gpt_buckets", actual=np.concatenate(rp.buckets[k]),
                     expected=np.concatenate(torch_step["buckets"]), context=f"step {k + 1}")
        assert [len(b) for b in rp.buckets[k]] == [len(b) for b in torch_step["buckets"]]
        for rank in range(ws):
            torch_rank = results[rank][index]["steps"][k]
            for i, (a, b) in enumerate(zip(rp.reduced[k], torch_rank["reduced"], strict=True)):
                assert_claim("ddp.gpt_reduced_grads", actual=a, expected=b,
                             context=f"{precision} ws {ws} step {k + 1} rank {rank} param {i}")
            assert rp.skipped[k] == torch_rank["skipped"], f"step {k + 1} rank {rank}"
        assert_claim("ddp.gpt_adamw", actual=np.float64(rp.lrs[k]),
                     expected=np.float64(torch_step["lr"]), context=f"lr at step {k + 1}")
    for rank in range(ws):
        torch_rank = results[rank][index]
        for i, (a, b) in enumerate(zip(rp.final[rank], torch_rank["final"], strict=True)):
            assert_claim("ddp.gpt_adamw", actual=a, expected=b,
                         context=f"{precision} ws {ws} rank {rank} param {i}")
        for key, value in rp.optimizer[rank].items():
            assert_claim("ddp.gpt_adamw", actual=np.asarray(value),
                         expected=torch_rank["optimizer"][key],
                         context=f"{precision} ws {ws} rank {rank} {key}")


@pytest.mark.parametrize("precision", DEFAULT)
def test_the_gpt_ddp_step_matches_the_simulated_ranks_bitwise(
        launched: tuple[Launch, Path], precision: str) -> None:
    """Two gloo ranks take 3 DDP steps of the GPT with AdamW and the cosine schedule; the
    reference's ranks, replaying each torch rank's local gradient, lay out the same bucket,
    reduce to the same bits, skip the same fp16 steps and end with the same parameters and
    AdamW state, bit for bit."""
    launch = launched[0]
    _check_step(launch, precision)
    if precision == "fp16":  # guard: the ranks had a step to agree on skipping
        rp = _replayed(launch, precision)[2]
        assert any(rp.skipped) and not all(rp.skipped), rp.skipped


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _applied_after_the_first(lines: list[str], first: int) -> bool:
    """Whether a step after `first` was applied (not skipped): one that reads the schedule's
    position and the AdamW step count the resumed run restored and then advanced."""
    return any(" skipped 0 " in line for line in lines if int(line.split()[1]) > first)


def test_the_gpt_run_stopped_and_resumed_ends_with_the_uninterrupted_digest(
        launched: tuple[Launch, Path]) -> None:
    """ddp.gpt_resume, torch, 2 ranks: the command's run stopped at its step-2 commit and
    resumed ends at step 6 with the digest of the run that never stopped."""
    (jobs, results), folder = launched
    first = next(i for i, j in enumerate(jobs) if j["kind"] == "cli-train")
    uninterrupted, stopped, resumed = (results[0][first + j] for j in range(3))
    for rank in range(2):  # each rank's digest is checked against the others' by the command
        assert results[rank][first + 2]["digest"] == resumed["digest"]
    assert stopped["step"] == 2 and resumed["step"] == uninterrupted["step"] == 6
    assert stopped["digest"] != uninterrupted["digest"], "guard: the stop was before the end"
    lines = _lines(folder / "stopped.log")
    assert [line.split()[1] for line in lines] == ["1", "2", "3", "4", "5", "6"]
    assert any(" skipped 1 " in line for line in lines), "guard: fp16 skips a step"
    assert _applied_after_the_first(lines, 3), "guard: an update after the resumed first"
    assert_claim("ddp.gpt_resume", actual=_hex(resumed["digest"]),
                 expected=_hex(uninterrupted["digest"]), context="torch, 2 ranks, at step 2")


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)


def _command(directory: Path, world_size: int, steps: int, *extra: str,
             impl: str = "reference") -> list[str]:
    """The command's stdout lines, run here (exit status 0 asserted)."""
    out = io.StringIO()
    argv = kills.argv(impl, directory, world_size, steps, drv.GPT_OPTIONS)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([*argv, *extra])
    assert status == 0
    return out.getvalue().strip().splitlines()


def test_the_reference_gpt_run_stopped_and_resumed_ends_with_the_uninterrupted_digest(
        tmp_path: Path) -> None:
    """ddp.gpt_resume, the reference's 2 simulated ranks: stopped at the step-2 commit
    (--horizon 6: the same schedule), resumed to step 6, the uninterrupted digest."""
    fast = ("--growth-interval", "1")  # the scale doubles each clean step: steps skip
    expected = _command(tmp_path / "uninterrupted", 2, 6, "--horizon", "6", *fast)
    assert any(" skipped 1 " in line for line in expected), "guard: fp16 skips a step"
    _command(tmp_path / "stopped", 2, 2, "--horizon", "6", *fast)
    lines = _command(tmp_path / "stopped", 2, 6, *fast)  # the horizon the run started with
    assert lines[0].startswith("step 3 "), "guard: it resumed, not started afresh"
    assert _applied_after_the_first(lines[:-1], 3), "guard: an update after the resumed first"
    assert_claim("ddp.gpt_resume", actual=_hex(kills.digest(lines)),
                 expected=_hex(kills.digest(expected)), context="reference, 2 ranks")


def test_the_two_rank_loss_curve_follows_the_single_process_run(
        launched: tuple[Launch, Path]) -> None:
    """ddp.gpt_loss_curve (the learning control): the fp32 2-rank run's loss at each of its
    3 steps is within the bound of torch's single-process run on the same global batches."""
    jobs, results = launched[0]
    index = next(i for i, j in enumerate(jobs)
                 if j["kind"] == "gpt" and j["config"]["precision"] == "fp32")
    ddp = np.array(drv.ddp_losses(results, index), np.float32)  # the float64 mean, rounded
    one = np.array(drv.one_process_losses(drv.config("fp32"), len(ddp)), np.float32)
    steps = np.arange(1, len(ddp) + 1)
    assert_claim("ddp.gpt_loss_curve", actual=ddp, expected=one,
                 scale=steps * np.abs(one), context="2 ranks, fp32")


# ------------------------------------------------------------------------- slow

@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3, 4])
def test_the_gpt_ddp_step_matches_at_three_and_four_ranks(world_size: int) -> None:
    """ddp.gpt_buckets, ddp.gpt_reduced_grads, ddp.gpt_adamw at 3 and 4 ranks (where the
    bucket's layout decides the ring's order), fp32, bf16 and fp16, and bf16 with the
    blocks and the attention cores recomputed. Measured: 3 to 7 s each."""
    import ranks

    jobs = drv.gpt_jobs(world_size, PRECISIONS)
    jobs += drv.gpt_jobs(world_size, ("bf16",), recompute="sqrt+selective")
    launch = (jobs, ranks.launch(jobs, world_size, timeout=300))
    for precision in PRECISIONS:
        _check_step(launch, precision)
    recomputed = (jobs[-1:], [[r[-1]] for r in launch[1]])
    _check_step(recomputed, "bf16")


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_loss_curve_over_sixty_steps(world_size: int) -> None:
    """ddp.gpt_loss_curve over 60 steps (cosine over 60), fp32. Measured: 5 to 12 s a world
    size, the single-process run included."""
    import ranks

    steps = 60
    results = ranks.launch(drv.gpt_jobs(world_size, ("fp32",), steps), world_size,
                           timeout=300)
    ddp = np.array(drv.ddp_losses(results, 0), np.float32)
    one = np.array(drv.one_process_losses(drv.config("fp32", steps), steps), np.float32)
    assert_claim("ddp.gpt_loss_curve", actual=ddp, expected=one,
                 scale=np.arange(1, steps + 1) * np.abs(one), context=f"{world_size} ranks")


KILLS = [(impl, ws, victim) for impl in ("reference", "torch") for ws in (2, 3)
         for victim in kills.VICTIMS]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "world_size", "victim"), KILLS)
def test_the_gpt_command_killed_during_a_save_resumes_to_the_uninterrupted_digest(
        impl: str, world_size: int, victim: str, tmp_path: Path) -> None:
    """ddp.gpt_resume through kills: the last rank once its share of a save appears, or the
    coordinator before the commit record (torch: the rank's process; the reference: the
    command's), then --resume. Measured: 3.5 to 7 s each."""
    expected = kills.digest(_command(tmp_path / "uninterrupted", world_size, kills.STEPS,
                                     impl=impl))
    directory = tmp_path / "killed"
    if impl == "torch":
        def command() -> int:
            out = io.StringIO()
            argv = kills.argv("torch", directory, world_size, options=drv.GPT_OPTIONS)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                return main(argv)

        status, hit = kills.kill_until_hit(lambda after: kills.kill_torch_rank(
            command, directory, world_size, victim, after), directory)
        assert status == 1
    else:
        status, hit = kills.kill_until_hit(lambda after: kills.kill_process(
            impl, directory, world_size, victim, after, options=drv.GPT_OPTIONS)[:2],
            directory)
        assert status == -9
    lines = _command(directory, world_size, kills.STEPS, impl=impl)
    assert int(lines[0].split()[1]) > kills.EVERY, "guard: it resumed, not started afresh"
    assert_claim("ddp.gpt_resume", actual=_hex(kills.digest(lines)), expected=_hex(expected),
                 context=f"{impl} ws {world_size} {victim} killed at {hit}")


@pytest.mark.slow
def test_recomputation_and_loader_workers_resume_to_the_uninterrupted_digest(
        tmp_path: Path) -> None:
    """ddp.gpt_resume at 3 torch ranks with the blocks and attention cores recomputed under
    bf16, 2 loader workers a rank before the stop and 1 after: the digest of 0 workers,
    never stopped. Measured: 28 s."""
    options = ("--recompute", "sqrt+selective", "--precision", "bf16", "--horizon", "4")
    expected = _command(tmp_path / "plain", 3, 4, *options, impl="torch")
    _command(tmp_path / "run", 3, 2, *options, "--loader-workers", "2", impl="torch")
    lines = _command(tmp_path / "run", 3, 4, *options, "--loader-workers", "1", impl="torch")
    assert lines[0].startswith("step 3 ")
    assert_claim("ddp.gpt_resume", actual=_hex(kills.digest(lines)),
                 expected=_hex(kills.digest(expected)), context="recompute, workers")

