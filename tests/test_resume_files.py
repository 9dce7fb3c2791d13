"""reference.resume and torch_impl.resume against the file contract both promise.

Each test runs on both implementations (the contract is the same; the payloads differ):
a save/load round trip keeps every value and type; any truncation or single bit flip is a
CheckpointCorruptError; a failing write (disk full, a failing rename) leaves the previous
file intact and no temporary file; versions and mismatches get their own errors; the
directory manager keeps K files, skips corrupt ones and removes leftovers.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reference import nn as ref_nn
from reference import optim as ref_optim
from reference import resume as ref_resume
from torch_impl import nn as t_nn
from torch_impl import resume as t_resume


def _reference_state(hidden: int = 16) -> dict:
    """A small complete-looking state: model, Adam after two steps, StepLR, rng, data."""
    rng = np.random.default_rng(0)
    model = ref_nn.make_mlp((8, hidden, 3), dropout=0.1, rng=rng)
    opt = ref_optim.Adam(model.parameters(), lr=1e-3)
    sched = ref_optim.StepLR(opt, step_size=2)
    for _ in range(2):
        for p in model.parameters():
            p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
        opt.step()
        sched.step()
    return {"config": {"sizes": [8, hidden, 3], "optimizer": "Adam"}, "step": 2, "epoch": 0,
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": {"scale": 65536.0, "growth_tracker": 3},
            "data": {"seed": 0, "num_samples": 64, "epoch": 0, "position": 16},
            "rng": {"init": rng.bit_generator.state}, "special": [float("inf"), None, True]}


def _torch_state(hidden: int = 16) -> dict:
    g = torch.Generator().manual_seed(0)
    model = t_nn.make_mlp((8, hidden, 3), dropout=0.1, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        sched.step()
    return {"config": {"sizes": [8, hidden, 3], "optimizer": "Adam"}, "step": 2, "epoch": 0,
            "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": {"scale": 65536.0, "growth_tracker": 3},
            "data": {"seed": 0, "num_samples": 64, "epoch": 0, "position": 16},
            "rng": {"init": g.get_state()}, "special": [float("inf"), None, True]}


IMPLS = {"reference": (ref_resume, _reference_state), "torch": (t_resume, _torch_state)}


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> tuple[ModuleType, object]:
    return IMPLS[request.param]


def _same(a: object, b: object, path: str = "state") -> None:
    """a and b equal in structure, type and bits (arrays/tensors compared bytewise)."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.numpy().tobytes() == b.numpy().tobytes(), path
    elif isinstance(a, np.ndarray | np.generic):
        assert (a.dtype, np.shape(a)) == (b.dtype, np.shape(b)), path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def test_round_trip_keeps_every_value_type_and_bit(impl: tuple, tmp_path: Path) -> None:
    """load_checkpoint(save_checkpoint(state)) is the same state, bit for bit, types kept."""
    mod, make = impl
    state = make()
    mod.save_checkpoint(tmp_path / "a.ckpt", state)
    _same(mod.load_checkpoint(tmp_path / "a.ckpt"), state)
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt"]


def test_save_refuses_what_cannot_be_loaded_without_pickle(impl: tuple, tmp_path: Path) -> None:
    """An object that would need pickle is a TypeError at save time, and nothing is written."""
    mod, _ = impl
    with pytest.raises(TypeError, match="save_checkpoint: bad"):
        mod.save_checkpoint(tmp_path / "a.ckpt", {"bad": object()})
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = {}
    for name, (mod, make) in IMPLS.items():
        path = tmp_path_factory.mktemp(name) / "a.ckpt"
        mod.save_checkpoint(path, make())
        out[name] = path.read_bytes()
    return out


@pytest.mark.parametrize("name", sorted(IMPLS))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_truncation_is_detected(name: str, saved: dict, tmp_path: Path,
                                    data: st.DataObject) -> None:
    """A checkpoint cut at any length (0 .. size-1 bytes) raises CheckpointCorruptError."""
    mod, _ = IMPLS[name]
    blob = saved[name]
    cut = data.draw(st.one_of(st.integers(0, len(blob) - 1),
                              st.sampled_from([0, 1, 43, 44, len(blob) - 32, len(blob) - 1])))
    event("cut inside the trailing digest" if cut >= len(blob) - 32 else "cut before it")
    path = tmp_path / f"cut-{cut}.ckpt"
    path.write_bytes(blob[:cut])
    with pytest.raises(mod.CheckpointCorruptError):
        mod.load_checkpoint(path)


@pytest.mark.parametrize("name", sorted(IMPLS))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bit_flip_is_detected(name: str, saved: dict, tmp_path: Path,
                                  data: st.DataObject) -> None:
    """Flipping any one bit anywhere (magic, header, payload, digest) is CheckpointCorruptError."""
    mod, _ = IMPLS[name]
    blob = bytearray(saved[name])
    pos = data.draw(st.integers(0, len(blob) - 1))
    bit = data.draw(st.integers(0, 7))
    blob[pos] ^= 1 << bit
    header_end = 12 + struct.unpack("<I", bytes(blob[8:12]))[0] if pos >= 12 else 12
    event("magic/length" if pos < 12 else "header" if pos < header_end
          else "digest" if pos >= len(blob) - 32 else "payload")
    path = tmp_path / f"flip-{pos}-{bit}.ckpt"
    path.write_bytes(bytes(blob))
    with pytest.raises(mod.CheckpointCorruptError):
        mod.load_checkpoint(path)


def _recontainer(blob: bytes, **header_changes: object) -> bytes:
    """The same checkpoint with header fields changed and a freshly computed, valid digest."""
    (hlen,) = struct.unpack("<I", blob[8:12])
    header = {**json.loads(blob[12:12 + hlen]), **header_changes}
    new_header = json.dumps(header, sort_keys=True).encode()
    body = blob[:8] + struct.pack("<I", len(new_header)) + new_header + blob[12 + hlen:-32]
    return body + hashlib.sha256(body).digest()


def test_another_format_version_is_a_version_error(impl: tuple, saved: dict,
                                                   tmp_path: Path) -> None:
    """A well-formed checkpoint of version 2 is refused with CheckpointVersionError."""
    mod, _ = impl
    name = "reference" if mod is ref_resume else "torch"
    path = tmp_path / "v2.ckpt"
    path.write_bytes(_recontainer(saved[name], version=2))
    with pytest.raises(mod.CheckpointVersionError, match="version 2"):
        mod.load_checkpoint(path)


def test_the_other_implementations_payload_is_refused_by_name(saved: dict,
                                                              tmp_path: Path) -> None:
    """Each loader refuses the other tree's payload kind, naming the conversion to use."""
    (tmp_path / "t.ckpt").write_bytes(saved["torch"])
    (tmp_path / "r.ckpt").write_bytes(saved["reference"])
    with pytest.raises(ref_resume.CheckpointVersionError, match="state_to_reference"):
        ref_resume.load_checkpoint(tmp_path / "t.ckpt")
    with pytest.raises(t_resume.CheckpointVersionError, match="state_from_reference"):
        t_resume.load_checkpoint(tmp_path / "r.ckpt")


def test_a_different_model_is_a_mismatch_naming_key_and_shapes(impl: tuple,
                                                               tmp_path: Path) -> None:
    """Loading into a wider model names the first differing key and both shapes."""
    mod, make = impl
    mod.save_checkpoint(tmp_path / "a.ckpt", make(hidden=16))
    like = {"model": make(hidden=32)["model"]}
    with pytest.raises(mod.CheckpointMismatchError, match=r"model/0\.weight.*\(16, 8\).*\(32, 8\)"):
        mod.load_checkpoint(tmp_path / "a.ckpt", like=like)
    with pytest.raises(mod.CheckpointMismatchError, match="config/sizes"):
        mod.load_checkpoint(tmp_path / "a.ckpt", like={"config": make(hidden=32)["config"]})
    mod.load_checkpoint(tmp_path / "a.ckpt", like={"model": make(hidden=16)["model"]})


def _fail_halfway(at_call: int) -> object:
    """A _write_all that hits a full disk halfway through its `at_call`-th call."""
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
    """ENOSPC halfway through a write: a CheckpointWriteError (errno ENOSPC), old file intact."""
    mod, make = impl
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    monkeypatch.setattr(mod, "_write_all", _fail_halfway(at_call))
    with pytest.raises(mod.CheckpointWriteError, match="untouched") as info:
        mod.save_checkpoint(path, make(hidden=32))
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.ckpt"]
    mod.load_checkpoint(path)


def test_a_failing_rename_keeps_the_previous_file_and_leaves_no_temp(
        impl: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If os.replace fails after the data was written, nothing at the final name changes."""
    mod, make = impl
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()

    def replace(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "simulated rename failure")

    monkeypatch.setattr(mod.os, "replace", replace)
    with pytest.raises(mod.CheckpointWriteError):
        mod.save_checkpoint(path, make(hidden=32))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.ckpt"]


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs under tmp_path (a REAL full disk), or a skip where mounting is denied."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                              capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot run mount: {e}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True, timeout=10, check=False)


def test_a_real_full_disk_keeps_the_previous_file_and_leaves_no_temp(
        impl: tuple, tiny_tmpfs: Path) -> None:
    """On a 64 KiB tmpfs, a checkpoint too big to fit fails with ENOSPC; the old one loads."""
    mod, make = impl
    path = tiny_tmpfs / "a.ckpt"
    mod.save_checkpoint(path, make(hidden=16))
    before = path.read_bytes()
    with pytest.raises(mod.CheckpointWriteError) as info:
        mod.save_checkpoint(path, make(hidden=2048))  # ~200 KB of parameters and moments
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert os.listdir(tiny_tmpfs) == ["a.ckpt"]
    mod.load_checkpoint(path)


def test_manager_keeps_the_last_k_and_resumes_from_the_newest_valid(impl: tuple,
                                                                     tmp_path: Path) -> None:
    """keep=2 leaves two files; a corrupt newest file is skipped and reported, not fatal."""
    mod, make = impl
    manager = mod.CheckpointManager(tmp_path, keep=2)
    state = make()
    for step in (5, 10, 15):
        manager.save(step, {**state, "step": step})
    assert [s for s, _ in manager.checkpoints()] == [10, 15]
    newest = manager.path(15)
    newest.write_bytes(newest.read_bytes()[:-100])  # torn
    path, loaded = manager.latest_valid()
    assert path == manager.path(10) and loaded["step"] == 10
    assert [p for p, _ in manager.skipped] == [newest]
    assert isinstance(manager.skipped[0][1], mod.CheckpointCorruptError)


def test_manager_returns_none_when_nothing_is_valid(impl: tuple, tmp_path: Path) -> None:
    """With only corrupt files, latest_valid() is None and every file is reported."""
    mod, _ = impl
    manager = mod.CheckpointManager(tmp_path)
    manager.path(1).write_bytes(b"garbage")
    assert manager.latest_valid() is None
    assert len(manager.skipped) == 1


def test_manager_cleanup_removes_the_temp_files_a_crash_left(impl: tuple,
                                                             tmp_path: Path) -> None:
    """cleanup() removes `.ckpt-*.tmp` leftovers and nothing else."""
    mod, make = impl
    manager = mod.CheckpointManager(tmp_path)
    manager.save(1, make())
    (tmp_path / ".ckpt-00000002.ckpt.abc123.tmp").write_bytes(b"half a file")
    (tmp_path / "notes.txt").write_text("keep me")
    removed = manager.cleanup()
    assert [p.name for p in removed] == [".ckpt-00000002.ckpt.abc123.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000001.ckpt", "notes.txt"]
