"""`python -m parity train --world-size N` killed during a save resumes to the digest of the
run that was not (ddp.cli_kill_resume): a rank SIGKILLed while the ranks write their
shares, the coordinator SIGKILLed after DCP's metadata and before the commit record; each
leaves the previous commit verified and loadable, and --resume ends with the uninterrupted
digest. Driver parity/drivers/ddp_train.py; the refusals and the directory policy:
tests/test_train_ranks.py.

Default cost: world size 2, the torch tree, in this process (one uninterrupted run, two
killed, two resumed: five launches of 2 ranks); the world sizes 2, 3, 4 x both trees x both
kill points, and the command itself SIGKILLed, are slow.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from ckpt import commit as ckc
from parity.compare import assert_claim
from parity.drivers import ddp_train as drv
from parity.lab.cli import main

pytest.importorskip("torch.distributed.checkpoint")


def run_in_process(impl: str, directory: Path, world_size: int) -> tuple[int, list[str]]:
    """(exit status, stdout lines) of the command run by parity.lab.cli.main here."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(drv.argv(impl, directory, world_size))
    return status, out.getvalue().strip().splitlines()


def _kill_rank(directory: Path, world_size: int, victim: str) -> tuple[int, int]:
    return drv.kill_until_hit(lambda after: drv.kill_torch_rank(
        lambda: run_in_process("torch", directory, world_size)[0], directory, world_size,
        victim, after), directory)


def _assert_digest(actual: str, expected: str, context: str) -> None:
    assert_claim("ddp.cli_kill_resume", actual=np.frombuffer(bytes.fromhex(actual), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(expected), np.uint8), context=context)


def _uninterrupted(impl: str, tmp: Path, world_size: int) -> str:
    status, lines = run_in_process(impl, tmp / f"uninterrupted-{impl}-{world_size}",
                                       world_size)
    assert status == 0
    assert any(" skipped 1 " in line for line in lines), "guard: fp16 must skip a step"
    return drv.digest(lines)


@pytest.fixture(scope="module")
def torch_2(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _uninterrupted("torch", tmp_path_factory.mktemp("ddp_train"), 2)


def _check_left(directory: Path, hit: int | None, impl: str) -> None:
    """The killed save is no checkpoint; the previous commit verifies and is the newest."""
    assert hit is not None, "the kill never found its save"
    assert not ckc.record_path(directory, hit).exists(), (
        f"the step-{hit} commit landed before the kill")
    assert ckc.uncommitted(directory) == [ckc.step_dir(directory, hit)]
    record, skipped = ckc.newest(directory, drv.payload(impl))
    assert record.step == hit - drv.EVERY and skipped == []


def _resumed(impl: str, directory: Path, world_size: int) -> str:
    status, lines = run_in_process(impl, directory, world_size)
    assert status == 0
    assert int(lines[0].split()[1]) > drv.EVERY, "guard: it resumed, not started afresh"
    assert " skipped 0 " in lines[0], "guard: the first step after the resume is not skipped"
    assert not ckc.uncommitted(directory), "the killed save's directory was removed"
    return drv.digest(lines)


@pytest.mark.parametrize("victim", drv.VICTIMS)
def test_a_rank_killed_during_a_save_resumes_to_the_uninterrupted_digest(
        torch_2: str, tmp_path: Path, victim: str) -> None:
    """ddp.cli_kill_resume, torch, 2 ranks: the last rank SIGKILLed once its share of a save
    appears, or the coordinator once DCP's .metadata does (before the commit record): the
    command fails naming the rank, the previous commit stands, and --resume ends with the
    uninterrupted digest."""
    directory = tmp_path / "killed"
    status, hit = _kill_rank(directory, 2, victim)
    assert status == 1, status
    _check_left(directory, hit, "torch")
    _assert_digest(_resumed("torch", directory, 2), torch_2, f"{victim} killed at {hit}")


MATRIX = [(impl, ws, victim) for impl in ("reference", "torch") for ws in (2, 3, 4)
          for victim in drv.VICTIMS]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "world_size", "victim"), MATRIX)
def test_every_world_size_and_tree_resumes_a_killed_save_to_the_uninterrupted_digest(
        impl: str, world_size: int, victim: str, tmp_path: Path) -> None:
    """ddp.cli_kill_resume for world sizes 2, 3, 4, both trees, both kill points (the
    reference's ranks share the command's process: the process is killed)."""
    expected = _uninterrupted(impl, tmp_path, world_size)
    directory = tmp_path / "killed"
    if impl == "torch":
        status, hit = _kill_rank(directory, world_size, victim)
        assert status == 1
    else:
        status, hit = drv.kill_until_hit(
            lambda after: drv.kill_process(impl, directory, world_size, victim, after)[:2],
            directory)
        assert status == -9
    _check_left(directory, hit, impl)
    _assert_digest(_resumed(impl, directory, world_size), expected,
                   f"{impl} ws {world_size} {victim} killed at {hit}")


@pytest.mark.slow
def test_the_command_sigkilled_leaves_no_rank_and_resumes_to_the_same_digest(
        torch_2: str, tmp_path: Path) -> None:
    """The torch command itself SIGKILLed while its ranks save: every rank ends (at its next
    step: its launcher is gone), none writes on, and --resume ends with the digest."""
    directory = tmp_path / "killed"
    status, hit, left = drv.kill_process("torch", directory, 2, "command")
    assert status == -9 and hit is not None
    assert left == [], f"processes outlived the command: {left}"
    _assert_digest(_resumed("torch", directory, 2), torch_2, f"command killed at {hit}")
