"""The training loop's directory policy (ckpt/policy.py, the table in docs/resume.md), in both
trees: what a run does with what it finds in its checkpoint directory. Nothing is lost: a
run never deletes, overwrites or counts an entry it could not read or did not write, and
every refusal changes nothing in the directory.

Each test runs reference.train.train and torch_impl.train.train on a tiny configuration.
"""

from __future__ import annotations

import errno
import importlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ckpt
from ckpt import atomic
from parity.drivers.resume import recontainer
from parity.drivers.resume_cross import converters

TINY = {"sizes": (4, 8, 3), "batch_size": 4, "num_samples": 8, "horizon": 40}


@pytest.fixture(params=["reference", "torch"])
def tree(request: pytest.FixtureRequest, device: str) -> ModuleType:
    """reference.train or torch_impl.train (the torch one on the --device given)."""
    if request.param == "reference":
        return importlib.import_module("reference.train")
    torch.set_num_threads(1)
    module = importlib.import_module("torch_impl.train")
    if device != "cpu":
        pytest.skip("the directory policy does not depend on the device")
    return module


def _train(tree: ModuleType, steps: int, directory: Path, every: int = 2, **kw: object
           ) -> tuple[object, list[str]]:
    lines: list[str] = []
    config = tree.TrainConfig(**{**TINY, **kw.pop("config", {})})  # type: ignore[dict-item]
    run = tree.train(config, steps, directory, every, log=lines.append, **kw)
    return run, lines


def _listing(directory: Path) -> dict[str, object]:
    """Every entry by name: a regular file's bytes (or, above 16 MiB, its inode, size and
    mtime: never read whole), a symlink's target, or the kind of anything else."""
    out: dict[str, object] = {}
    for e in os.scandir(directory):
        st = e.stat(follow_symlinks=False)
        if e.is_symlink():
            out[e.name] = f"symlink -> {os.readlink(e.path)}"
        elif e.is_file(follow_symlinks=False):
            out[e.name] = (Path(e.path).read_bytes() if st.st_size < 2**24
                           else (st.st_ino, st.st_size, st.st_mtime_ns))
        else:
            out[e.name] = "directory" if e.is_dir(follow_symlinks=False) else "other"
    return out


def _steps(lines: list[str]) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith("step ")]


def test_every_policy_row_names_a_test_that_exists() -> None:
    """docs/resume.md's table is ckpt.POLICY; each row is held by a test of that name."""
    here = {name for name in globals() if name.startswith("test_")}
    missing = [test for _, _, test in ckpt.POLICY if test not in here]
    assert not missing


def test_resume_with_nothing_to_resume_says_so_and_starts_at_step_0(
        tree: ModuleType, tmp_path: Path) -> None:
    """--resume into an empty (or missing) directory: one line says so, then step 1."""
    run, lines = _train(tree, 2, tmp_path / "new", resume_from_latest=True)
    assert lines[0] == f"nothing to resume in {tmp_path / 'new'}: starting at step 0"
    assert _steps(lines) == [1, 2] and run.step == 2


def test_strict_resume_with_nothing_to_resume_is_refused_leaving_no_directory(
        tree: ModuleType, tmp_path: Path) -> None:
    """strict: a missing directory (and its missing parent) is refused, and not left behind."""
    with pytest.raises(ckpt.CheckpointDirectoryError, match=r"nothing to resume in .*strict"):
        _train(tree, 2, tmp_path / "a" / "new", resume_from_latest=True, strict=True)
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_run_into_a_directory_with_checkpoints_is_refused(
        tree: ModuleType, tmp_path: Path) -> None:
    """A longer run's checkpoints are not mixed with, pruned for, or overwritten by a fresh
    run: refused, naming what is there; the directory is unchanged."""
    _train(tree, 8, tmp_path, every=4)
    before = _listing(tmp_path)
    with pytest.raises(ckpt.CheckpointDirectoryError, match=r"2 checkpoints \(steps 4-8\).*"
                       r"--resume.*--overwrite"):
        _train(tree, 4, tmp_path)
    assert _listing(tmp_path) == before


def test_overwrite_removes_only_readable_checkpoints_and_says_so(
        tree: ModuleType, tmp_path: Path) -> None:
    """--overwrite deletes the checkpoints it can read (naming each), keeps an entry it
    cannot read, and starts at step 0."""
    _train(tree, 4, tmp_path, every=2)
    (tmp_path / "ckpt-00000090.ckpt").write_bytes(b"not a checkpoint")
    _, lines = _train(tree, 2, tmp_path, every=0, overwrite=True)
    assert sorted(line.split()[1] for line in lines if line.startswith("removed")) == [
        "ckpt-00000002.ckpt", "ckpt-00000004.ckpt"]
    assert any(line.startswith("kept ckpt-00000090.ckpt: cannot read it") for line in lines)
    assert _steps(lines) == [1, 2]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.ckpt", "ckpt-00000090.ckpt"]


def test_resume_and_overwrite_together_are_refused(tree: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ckpt.CheckpointDirectoryError, match="choose one"):
        _train(tree, 2, tmp_path, resume_from_latest=True, overwrite=True)


def _odd_entries(directory: Path) -> None:
    """A dangling symlink, a FIFO, a directory, a 1 TiB sparse file and a garbage file, all
    under checkpoint names with steps above the real checkpoints."""
    os.symlink(directory / "gone.ckpt", directory / "ckpt-00000099.ckpt")
    os.mkfifo(directory / "ckpt-00000098.ckpt")
    (directory / "ckpt-00000097.ckpt").mkdir()
    with open(directory / "ckpt-00000096.ckpt", "wb") as f:
        f.truncate(2**40)
    (directory / "ckpt-00000095.ckpt").write_bytes(b"garbage" * 100)


def test_odd_entries_are_reported_and_skipped_and_valid_checkpoints_resume(
        tree: ModuleType, tmp_path: Path) -> None:
    """Symlink, FIFO, directory, huge file and garbage under checkpoint names: each reported
    with what it is, none opened as a file or deleted; the run resumes from the valid
    checkpoint and ends with the uninterrupted run's digest."""
    _train(tree, 4, tmp_path, every=2)
    _odd_entries(tmp_path)
    odd = {k: v for k, v in _listing(tmp_path).items() if "0009" in k}
    run, lines = _train(tree, 6, tmp_path, every=2, keep=1, resume_from_latest=True)
    skipped = {line.split()[1].rstrip(":"): line for line in lines if line.startswith("skipped")}
    assert "a symbolic link" in skipped["ckpt-00000099.ckpt"]
    assert "a FIFO" in skipped["ckpt-00000098.ckpt"]
    assert "a directory" in skipped["ckpt-00000097.ckpt"]
    assert "do not add up" in skipped["ckpt-00000096.ckpt"] or "magic" in skipped[
        "ckpt-00000096.ckpt"]
    assert "bad magic" in skipped["ckpt-00000095.ckpt"]
    assert "resumed from ckpt-00000004.ckpt at step 4" in lines
    assert {k: v for k, v in _listing(tmp_path).items() if "0009" in k} == odd
    expected = tree.train(tree.TrainConfig(**TINY), 6)
    assert tree.state_digest(run.state_dict()) == tree.state_digest(expected.state_dict())


def _flip(path: Path, where: str) -> None:
    """Damage a checkpoint so that its frame and header still read (no digest checked):
    a payload byte flipped, or the header's precision "fp32" made "bf16" (same length)."""
    blob = bytearray(path.read_bytes())
    if where == "payload":
        blob[len(blob) // 2] ^= 0x01
    else:
        i = blob.index(b'"precision": "fp32"')
        blob[i:i + 19] = b'"precision": "bf16"'
    path.write_bytes(bytes(blob))
    assert ckpt.directory.read_entry(path, int(path.stem[5:]), verify=False).header is not None
    assert ckpt.directory.read_entry(path, int(path.stem[5:])).header is None


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_newest_checkpoint_that_does_not_verify_is_skipped_for_the_older_one(
        tree: ModuleType, tmp_path: Path, where: str) -> None:
    """The newest file reads as a checkpoint of this run (or, its header damaged, of
    another precision) but its digest does not match: skipped with what a verified read
    says of it, the run continues from the one before (no refusal on a damaged header's
    word), keeps the damaged file aside and ends with the uninterrupted run's digest."""
    _train(tree, 4, tmp_path, every=2)
    newest = tmp_path / "ckpt-00000004.ckpt"
    _flip(newest, where)
    damaged = newest.read_bytes()
    problem = ckpt.directory.read_entry(newest, 4).problem
    assert problem is not None and "does not match the stored digest" in problem
    run, lines = _train(tree, 6, tmp_path, every=2, resume_from_latest=True)
    assert lines[:2] == [f"skipped ckpt-00000004.ckpt: {problem}",
                         "resumed from ckpt-00000002.ckpt at step 2"]
    assert (tmp_path / "ckpt-00000004.ckpt.unreadable").read_bytes() == damaged
    expected = tree.train(tree.TrainConfig(**TINY), 6)
    assert tree.state_digest(run.state_dict()) == tree.state_digest(expected.state_dict())


def test_an_owned_checkpoint_that_does_not_verify_is_kept_not_pruned(
        tree: ModuleType, tmp_path: Path) -> None:
    """The oldest of three checkpoints is damaged where only its digest sees it: the resume
    does not read it at the start; when pruning reaches it, it does not verify, so it is kept
    (byte for byte) and reported, and holds no slot: the three newest verified ones stay."""
    _train(tree, 6, tmp_path, every=2, keep=3)
    oldest = tmp_path / "ckpt-00000002.ckpt"
    _flip(oldest, "payload")
    damaged = oldest.read_bytes()
    _, lines = _train(tree, 8, tmp_path, every=2, keep=3, resume_from_latest=True)
    assert not any(line.startswith("skipped") for line in lines)
    assert lines[0] == "resumed from ckpt-00000006.ckpt at step 6"
    kept = [line for line in lines if line.startswith("kept ")]
    assert kept == [f"kept ckpt-00000002.ckpt: cannot read it "
                    f"({ckpt.directory.read_entry(oldest, 2).problem})"]
    assert oldest.read_bytes() == damaged
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-0000000{s}.ckpt" for s in (2, 4, 6, 8)]
    _train(tree, 10, tmp_path, every=2, keep=3, resume_from_latest=True)
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-000000{s:02d}.ckpt" for s in (2, 6, 8, 10)]
    assert oldest.read_bytes() == damaged


def test_resume_with_only_unreadable_entries_is_refused(tree: ModuleType,
                                                        tmp_path: Path) -> None:
    """Entries under checkpoint names and none readable: refused (no silent step 1)."""
    _odd_entries(tmp_path)
    before = _listing(tmp_path)
    with pytest.raises(ckpt.CheckpointDirectoryError, match="nothing to resume"):
        _train(tree, 4, tmp_path, resume_from_latest=True)
    assert _listing(tmp_path) == before


def test_a_changed_configuration_is_refused_naming_the_fields(tree: ModuleType,
                                                              tmp_path: Path) -> None:
    """Another precision and horizon: refused naming both fields, nothing changed."""
    _train(tree, 4, tmp_path)
    before = _listing(tmp_path)
    with pytest.raises(ckpt.CheckpointMismatchError) as info:
        _train(tree, 6, tmp_path, resume_from_latest=True,
               config={"precision": "bf16", "horizon": 6})
    assert ("horizon: 40 in the checkpoint, 6 now; precision: 'fp32' in the checkpoint, "
            "'bf16' now") in str(info.value)
    assert _listing(tmp_path) == before


def test_a_newer_format_version_is_refused_not_skipped(tree: ModuleType,
                                                       tmp_path: Path) -> None:
    """The newest checkpoint of a newer format (valid digest) is not skipped in favour of
    an older one, nor overwritten: the resume is refused naming the version."""
    _train(tree, 4, tmp_path)
    newest = tmp_path / "ckpt-00000004.ckpt"
    newest.write_bytes(recontainer(newest.read_bytes(), version=ckpt.VERSION + 1))
    before = _listing(tmp_path)
    with pytest.raises(ckpt.CheckpointDirectoryError, match=fr"version {ckpt.VERSION + 1}.*newer"):
        _train(tree, 6, tmp_path, resume_from_latest=True)
    assert _listing(tmp_path) == before


def test_a_checkpoint_beyond_the_steps_asked_for_is_refused(tree: ModuleType,
                                                            tmp_path: Path) -> None:
    """A run that went to step 8 is not 'resumed' by a run asked for 4 steps."""
    _train(tree, 8, tmp_path, every=4)
    with pytest.raises(ckpt.CheckpointDirectoryError, match="step 8, beyond the 4 steps"):
        _train(tree, 4, tmp_path, resume_from_latest=True)


def test_resume_continues_from_the_other_implementation_through_the_mapping(
        tree: ModuleType, tmp_path: Path) -> None:
    """The other tree's newest checkpoint is continued through the state mapping, saying so
    (the other tree's files are never deleted); without a converter, refused."""
    other = importlib.import_module("torch_impl.train" if tree.__name__.startswith("reference")
                                    else "reference.train")
    _train(other, 4, tmp_path, every=2)
    theirs = _listing(tmp_path)
    with pytest.raises(ckpt.CheckpointDirectoryError, match="converts between"):
        _train(tree, 6, tmp_path, resume_from_latest=True)
    name = "reference" if tree.__name__.startswith("reference") else "torch"
    run, lines = _train(tree, 12, tmp_path, every=2, keep=1, resume_from_latest=True,
                        foreign=converters(name))
    assert any(line.startswith("resumed from ckpt-00000004.ckpt at step 4 (written by ") and
               "converted; dropout streams restart from the seed" in line for line in lines)
    assert _steps(lines) == list(range(5, 13)) and run.step == 12
    assert {k: _listing(tmp_path)[k] for k in theirs} == theirs
    assert sorted(set(os.listdir(tmp_path)) - set(theirs)) == ["ckpt-00000012.ckpt"]


def test_an_unreadable_entry_at_a_name_the_run_writes_is_renamed_aside(
        tree: ModuleType, tmp_path: Path) -> None:
    """A garbage file at ckpt-6 is kept as ckpt-00000006.ckpt.unreadable, not overwritten."""
    _train(tree, 4, tmp_path)
    (tmp_path / "ckpt-00000006.ckpt").write_bytes(b"precious, unreadable")
    _, lines = _train(tree, 6, tmp_path, resume_from_latest=True)
    assert (tmp_path / "ckpt-00000006.ckpt.unreadable").read_bytes() == b"precious, unreadable"
    assert any(line.startswith("renamed ckpt-00000006.ckpt to ") for line in lines)
    assert tree.resume.load_checkpoint(tmp_path / "ckpt-00000006.ckpt")["step"] == 6


def test_pruning_counts_and_deletes_only_owned_checkpoints(tree: ModuleType,
                                                           tmp_path: Path) -> None:
    """keep=2 counts only this run's checkpoints: a garbage file at a high step holds no
    slot, and neither it, an odd entry nor the other tree's checkpoint is ever deleted."""
    other = importlib.import_module("torch_impl.train" if tree.__name__.startswith("reference")
                                    else "reference.train")
    _train(other, 1, tmp_path / "other", every=1)
    os.replace(tmp_path / "other" / "ckpt-00000001.ckpt", tmp_path / "ckpt-00000001.ckpt")
    os.rmdir(tmp_path / "other")
    _train(tree, 4, tmp_path, every=2, overwrite=True, keep=5)  # removes the other's file
    _train(other, 1, tmp_path / "other", every=1)
    os.replace(tmp_path / "other" / "ckpt-00000001.ckpt", tmp_path / "ckpt-00000001.ckpt")
    os.rmdir(tmp_path / "other")
    _odd_entries(tmp_path)
    kept = {k: v for k, v in _listing(tmp_path).items() if k[5:13] in ("00000001", "00000095",
                                                                        "00000096", "00000097",
                                                                        "00000098", "00000099")}
    _train(tree, 10, tmp_path, every=2, keep=2, resume_from_latest=True)
    after = _listing(tmp_path)
    assert {k: after[k] for k in kept} == kept
    assert sorted(set(after) - set(kept)) == ["ckpt-00000008.ckpt", "ckpt-00000010.ckpt"]


def test_a_second_run_on_a_locked_directory_is_refused(tree: ModuleType,
                                                       tmp_path: Path) -> None:
    """While one run holds the directory, another is refused before it trains."""
    holder = tree.resume.CheckpointManager(tmp_path)
    with holder.opened(), pytest.raises(ckpt.CheckpointDirectoryError, match="in use"):
        _train(tree, 2, tmp_path)


@pytest.mark.parametrize("where", ["read-only filesystem", "parent is a file"])
def test_an_unwritable_directory_is_refused_before_training(
        tree: ModuleType, tmp_path: Path, where: str,
        tmpfs: Callable[[str], Path]) -> None:
    """Found by the writability probe before step 1, naming the directory."""
    if where == "parent is a file":
        (tmp_path / "file").write_text("x")
        directory = tmp_path / "file" / "ckpt"
    else:
        directory = tmpfs("size=64k,ro")
    lines: list[str] = []
    with pytest.raises((ckpt.CheckpointWriteError, ckpt.CheckpointDirectoryError),
                       match=str(directory)):
        tree.train(tree.TrainConfig(**TINY), 4, directory, 2, log=lines.append)
    assert _steps(lines) == []


def test_disk_full_at_a_checkpoint_names_it_and_keeps_the_earlier_ones(
        tree: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC at the second checkpoint: CheckpointWriteError naming ckpt-00000004.ckpt, no
    temporary file, and the first checkpoint still loads (nothing was pruned)."""
    real = atomic.write_all
    calls = [0]

    def counting(fd: int, data: memoryview) -> None:
        calls[0] += 1
        real(fd, data)

    monkeypatch.setattr(atomic, "write_all", counting)
    _train(tree, 2, tmp_path / "count", every=2)  # the probe's write and one checkpoint's
    monkeypatch.setattr(atomic, "write_all", _fail_after(real, calls[0] + 1))
    with pytest.raises(ckpt.CheckpointWriteError, match=r"ckpt-00000004\.ckpt") as info:
        _train(tree, 6, tmp_path / "run", every=2, keep=1)
    assert ".tmp" not in str(info.value) and info.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path / "run")) == ["ckpt-00000002.ckpt"]
    tree.resume.load_checkpoint(tmp_path / "run" / "ckpt-00000002.ckpt")


def _fail_after(real: Callable[[int, memoryview], None], calls: int
                ) -> Callable[[int, memoryview], None]:
    """write_all that fails with ENOSPC from its `calls`-th call on."""
    count = [0]

    def write_all(fd: int, data: memoryview) -> None:
        count[0] += 1
        if count[0] >= calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)
    return write_all


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """mount(options) -> a tmpfs under tmp_path (unmounted after), or a skip."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                              capture_output=True, timeout=10, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=10, check=False)
