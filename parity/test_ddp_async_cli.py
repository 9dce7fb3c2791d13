"""`python -m parity train --world-size N --async-save` (ddp.async_resume), the command over
the protocol parity/test_ddp_async.py holds: pinned staging refused where it cannot run, the
reference's asynchronous run ending on the synchronous run's digest, a failed background
write ending in one line and resuming, and (slow) the command killed during a save, in
both trees, resuming to the synchronous digest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt import commit as ckc
from parity.compare import assert_claim
from parity.drivers import ddp_train as kills

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

CLAIM = "ddp.async_resume"


def _command(directory: Path, impl: str, *extra: str) -> list[str]:
    """`train --world-size 2` (kills.argv's run), run here: its stdout lines (status 0)."""
    import contextlib
    import io

    from parity.lab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([*kills.argv(impl, directory, 2), *extra])
    assert status == 0
    return out.getvalue().strip().splitlines()


def test_the_command_refuses_pinned_staging_it_cannot_run_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--async-save pinned: refused by the reference always and by torch without CUDA;
    --async-save without --world-size N: refused (exit 2, one line, nothing created)."""
    from parity.lab.cli import main

    cases = [("reference", "pinned", "2"), ("torch", "copy", "1")]
    if not torch.cuda.is_available():
        cases.append(("torch", "pinned", "2"))
    for impl, mode, n in cases:
        directory = tmp_path / f"{impl}-{mode}-{n}"
        status = main(["train", "--impl", impl, "--steps", "2", "--checkpoint-dir",
                       str(directory), "--world-size", n, "--async-save", mode])
        err = capsys.readouterr().err.strip()
        assert status == 2 and len(err.splitlines()) == 1 and "--async-save" in err, err
        assert not directory.exists()


def test_the_reference_command_saving_asynchronously_ends_with_the_sync_digest(
        tmp_path: Path) -> None:
    """`train --impl reference --world-size 2 --async-save` (saves at 2, 4, ... 10, --keep
    2) prints the digest of the same run saving synchronously and keeps the same commits.
    Measured: 0.1 s."""
    sync = _command(tmp_path / "sync", "reference")
    asynchronous = _command(tmp_path / "async", "reference", "--async-save")
    assert asynchronous[:-1] == sync[:-1], "the step lines"
    assert_claim(CLAIM, actual=np.frombuffer(bytes.fromhex(kills.digest(asynchronous)), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(kills.digest(sync)), np.uint8),
                 context="reference, 2 ranks")
    names = [[p.name for p in ckc.records(tmp_path / d)] for d in ("sync", "async")]
    assert names[0] == names[1] == ["COMMITTED-00000010.json", "COMMITTED-00000008.json"]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "victim"), [(i, v) for i in ("reference", "torch")
                                              for v in kills.VICTIMS])
def test_the_command_killed_during_an_async_save_resumes_to_the_sync_runs_digest(
        impl: str, victim: str, tmp_path: Path) -> None:
    """`train --world-size 2 --async-save` SIGKILLed during a background write (the last
    rank once its share appears) or between the data and the record (the coordinator),
    then --resume: the digest of the run that saved synchronously and was never killed.
    Measured: 1.3 to 4.4 s each (the reference kills its command, a process)."""
    import contextlib
    import io

    from parity.lab.cli import main

    expected = kills.digest(_command(tmp_path / "sync", impl))
    directory = tmp_path / "killed"
    options = (*kills.OPTIONS, "--async-save")
    if impl == "torch":
        def command() -> int:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                return main([*kills.argv("torch", directory, 2), "--async-save"])

        status, hit = kills.kill_until_hit(lambda after: kills.kill_torch_rank(
            command, directory, 2, victim, after), directory)
        assert status == 1
    else:
        status, hit = kills.kill_until_hit(lambda after: kills.kill_process(
            impl, directory, 2, victim, after, options=options)[:2], directory)
        assert status == -9
    lines = _command(directory, impl, "--async-save")
    assert int(lines[0].split()[1]) > kills.EVERY, "guard: it resumed, not started afresh"
    assert_claim(CLAIM, actual=np.frombuffer(bytes.fromhex(kills.digest(lines)), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(expected), np.uint8),
                 context=f"{impl} {victim} killed at step {hit}")


def test_the_reference_command_whose_async_write_fails_ends_in_one_line_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's background write of step 4 raises (a full disk, seeded): the command
    ends with one line naming the step and exit 1, step 2 is the newest commit, and
    --resume ends on the sync run's digest. Measured: 0.15 s."""
    from parity.lab.cli import main
    from reference import async_ckpt as ra

    sync = kills.digest(_command(tmp_path / "sync", "reference"))
    write = ra.resume.save_checkpoint

    def full_at_step_4(path: Path, state: dict) -> None:
        if path.parent.name == "step-00000004":
            raise OSError(28, "No space left on device (seeded)")
        write(path, state)

    directory = tmp_path / "failed"
    with monkeypatch.context() as patch:
        patch.setattr(ra.resume, "save_checkpoint", full_at_step_4)
        status = main([*kills.argv("reference", directory, 2), "--async-save", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and err[-1].startswith("train: async save of step 4 failed: "
                                              "OSError:"), err
    assert [p.name for p in ckc.records(directory)] == ["COMMITTED-00000002.json"]
    lines = _command(directory, "reference", "--async-save")
    assert lines[0].startswith("step 3 "), "guard: resumed from step 2"
    assert_claim(CLAIM, actual=np.frombuffer(bytes.fromhex(kills.digest(lines)), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(sync), np.uint8),
                 context="reference, resumed after a failed write")
