"""The writing side of both trees' checkpoints: the atomic write (ckpt/atomic.py).

A failing write (disk full halfway, a real full disk, a read-only filesystem) leaves the
previous file intact, no temporary file, and a CheckpointWriteError naming the user's path.
The system calls of an atomic write are recorded and their order asserted for any state,
and a failure is injected at each one of them. The digest: tests/test_resume_digest.py.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt import atomic
from parity.drivers.resume import flatten, small_reference_state, small_torch_state
from parity.strategies import examples
from reference import resume as ref_resume
from torch_impl import resume as t_resume

IMPLS = {"reference": (ref_resume, small_reference_state),
         "torch": (t_resume, small_torch_state)}


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> tuple:
    return IMPLS[request.param]


def _bits(state: dict) -> dict[str, bytes]:
    return {k: v.dtype.str.encode() + str(v.shape).encode() + v.tobytes()
            for k, v in flatten(state).items()}


# ---------------------------------------------------------------- failing writes


def _fail_halfway(at_call: int) -> Callable[[int, memoryview], None]:
    """A write_all that hits a full disk halfway through its `at_call`-th call."""
    calls = [0]

    def write_all(fd: int, data: memoryview) -> None:
        calls[0] += 1
        if calls[0] < at_call:
            os.write(fd, data)
            return
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_all


@pytest.mark.parametrize("at_call", [1, 3])  # in the header; inside the serializer's writes
def test_disk_full_mid_write_keeps_the_previous_file_and_leaves_no_temp(
        impl: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    """ENOSPC halfway through a write: a CheckpointWriteError (errno ENOSPC) naming the
    checkpoint's path and no temporary name; the old file intact."""
    mod, make = impl
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    monkeypatch.setattr(atomic, "write_all", _fail_halfway(at_call))
    with pytest.raises(mod.CheckpointWriteError, match="untouched") as info:
        mod.save_checkpoint(path, make(hidden=32))
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert str(path) in str(info.value) and ".tmp" not in str(info.value)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.ckpt"]
    mod.load_checkpoint(path)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """mount(options) -> a fresh tmpfs under tmp_path, or a skip where mounting is denied."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                                  capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot run mount: {e}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=10, check=False)


def test_a_real_full_disk_keeps_the_previous_file_and_leaves_no_temp(
        impl: tuple, tmpfs: Callable[[str], Path]) -> None:
    """On a 64 KiB tmpfs, a checkpoint too big to fit fails with ENOSPC; the old one loads.
    (torch.save reports the failed write as a RuntimeError: the writer keeps the OSError.)"""
    mod, make = impl
    disk = tmpfs("size=64k")
    path = disk / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    with pytest.raises(mod.CheckpointWriteError) as info:
        mod.save_checkpoint(path, make(hidden=2048))  # ~200 KB of parameters and moments
    assert info.value.errno == errno.ENOSPC and ".tmp" not in str(info.value)
    assert path.read_bytes() == before
    assert os.listdir(disk) == ["a.ckpt"]
    mod.load_checkpoint(path)


def test_a_read_only_filesystem_is_a_write_error_naming_the_path(
        impl: tuple, tmpfs: Callable[[str], Path]) -> None:
    """EROFS: CheckpointWriteError naming the checkpoint's path (root ignores chmod, so the
    filesystem itself is mounted read-only)."""
    mod, make = impl
    path = tmpfs("size=64k,ro") / "a.ckpt"
    with pytest.raises(mod.CheckpointWriteError, match=str(path)) as info:
        mod.save_checkpoint(path, make())
    assert info.value.errno == errno.EROFS and ".tmp" not in str(info.value)


# ---------------------------------------------------------------- the system calls, in order


class _Recorder:
    """Stands in for `os` inside ckpt.atomic: records the calls NOTE [ Atomic write ] orders,
    labelled by what they touch (temp, dir, final), and makes the `fail_at`-th one fail, or
    lets the `interrupt_after`-th one succeed and then raises KeyboardInterrupt as it returns
    (where a SIGTERM or Ctrl-C handler may run: before the caller has stored the result)."""

    CALLS = ("open", "write", "fsync", "close", "replace", "unlink")

    def __init__(self, directory: Path, fail_at: int | None = None,
                 interrupt_after: int | None = None) -> None:
        self.directory, self.fail_at = directory, fail_at
        self.interrupt_after = interrupt_after
        self.calls: list[str] = []
        self.fds: dict[int, str] = {}

    def _label(self, name: str, args: tuple) -> str:
        if name == "open":
            return f"open {'dir' if Path(args[0]) == self.directory else 'temp'}"
        if name in ("write", "fsync", "close"):
            return f"{name} {self.fds.get(args[0], '?')}"
        return name

    def __getattr__(self, name: str) -> object:
        real = getattr(os, name)
        if name not in self.CALLS:
            return real

        def call(*args: object, **kwargs: object) -> object:
            label = self._label(name, args)
            if not (label == "write temp" and self.calls[-1:] == ["write temp"]):
                self.calls.append(label)  # consecutive writes are one entry
            if len(self.calls) - 1 == self.fail_at:
                if name == "close":
                    real(*args, **kwargs)  # a failing close still releases the descriptor
                raise OSError(errno.EIO, "injected failure")
            result = real(*args, **kwargs)
            if name == "open":
                self.fds[result] = label.split()[1]
            if len(self.calls) - 1 == self.interrupt_after:
                self.interrupt_after = None  # one signal
                raise KeyboardInterrupt
            return result
        return call


ORDER = ["open temp", "write temp", "fsync temp", "close temp", "replace", "open dir",
         "fsync dir", "close dir"]


def _states() -> st.SearchStrategy[dict]:
    arrays = st.builds(lambda shape, seed: np.asarray(np.random.default_rng(seed)
                                                      .standard_normal(shape), np.float32),
                       st.lists(st.integers(0, 5), max_size=3).map(tuple),
                       st.integers(0, 2**32 - 1))
    return st.dictionaries(st.text("abcxyz", min_size=1, max_size=5),
                           st.one_of(arrays, st.integers(), st.floats(allow_nan=False)),
                           max_size=4)


@pytest.mark.parametrize("name", sorted(IMPLS))
@settings(examples(15), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=_states())
def test_an_atomic_write_makes_its_system_calls_in_the_documented_order(
        name: str, state: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """open temp, write, fsync temp, close, replace, open dir, fsync dir, close: the file's
    bytes are durable before its name, and its name before save_checkpoint returns."""
    mod, _ = IMPLS[name]
    if name == "torch":
        state = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                 for k, v in state.items()}
    recorder = _Recorder(tmp_path)
    monkeypatch.setattr(atomic, "os", recorder)
    mod.save_checkpoint(tmp_path / "a.ckpt", state)
    monkeypatch.undo()
    assert recorder.calls == ORDER
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]
    assert _bits(mod.load_checkpoint(tmp_path / "a.ckpt")) == _bits(state)


@pytest.mark.parametrize("name", sorted(IMPLS))
@pytest.mark.parametrize("fail_at", range(len(ORDER)))
def test_a_failure_at_any_system_call_keeps_the_final_name_safe(
        name: str, fail_at: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure at any call before the rename: the temp file is unlinked, replace is never
    reached (or fails), the old file is intact. After it: the new file is complete and the
    error says the rename may not be durable. Always a CheckpointWriteError naming the path."""
    mod, make = IMPLS[name]
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    recorder = _Recorder(tmp_path, fail_at)
    monkeypatch.setattr(atomic, "os", recorder)
    with pytest.raises(mod.CheckpointWriteError) as info:
        mod.save_checkpoint(path, make(hidden=32))
    monkeypatch.undo()
    assert recorder.calls[fail_at] == ORDER[fail_at], "guard: the injection hit its call"
    assert str(path) in str(info.value) and ".tmp" not in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]  # no temporary file left
    assert recorder.calls[: fail_at + 1] == ORDER[: fail_at + 1]
    if fail_at <= ORDER.index("replace"):  # the temp file is closed, then unlinked
        closing = ["close temp"] if ORDER[fail_at] in ("write temp", "fsync temp") else []
        assert recorder.calls[fail_at + 1:] == ([*closing, "unlink"] if fail_at else [])
        assert path.read_bytes() == before
    else:  # renamed: only the directory's sync failed
        assert recorder.calls[fail_at + 1:] == (["close dir"] if ORDER[fail_at] == "fsync dir"
                                                else [])
        assert "rename may not survive" in str(info.value)
        assert mod.load_checkpoint(path)["config"]["sizes"] == [8, 32, 3]


@pytest.mark.parametrize("name", sorted(IMPLS))
@pytest.mark.parametrize("after", range(ORDER.index("replace") + 1))
def test_an_interrupt_as_any_call_returns_leaves_no_temporary_file(
        name: str, after: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM and Ctrl-C are exceptions raised where the interpreter next looks, which can be
    the instant a call returns, before its result is stored: after the open, no descriptor is
    kept and the file exists. The interrupt propagates as itself, no temporary file is left,
    and the final name holds the old file (before the rename) or the new one (after it)."""
    mod, make = IMPLS[name]
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    recorder = _Recorder(tmp_path, interrupt_after=after)
    monkeypatch.setattr(atomic, "os", recorder)
    with pytest.raises(KeyboardInterrupt):
        mod.save_checkpoint(path, make(hidden=32))
    monkeypatch.undo()
    assert recorder.calls[after] == ORDER[after], "guard: the interrupt came after its call"
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]  # no temporary file left
    hidden = mod.load_checkpoint(path)["config"]["sizes"][1]
    assert (path.read_bytes() == before) if ORDER[after] != "replace" else hidden == 32
