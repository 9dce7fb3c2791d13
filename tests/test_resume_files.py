"""reference.resume and torch_impl.resume against the file contract both promise: the shared
container of the `ckpt` package around each tree's payload (the writing side:
tests/test_resume_atomic.py).

Each test runs on both implementations (the contract is the same; the payloads differ): a
save/load round trip keeps every value and type; any truncation or single bit flip is a
CheckpointCorruptError; lengths are checked against the file's size before its body is read
(a huge file costs 52 bytes of reading); only a regular file is opened (a FIFO never
blocks); versions and mismatches get their own errors, the configuration's named by field.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ckpt
from parity.drivers.resume import recontainer, small_reference_state, small_torch_state
from reference import resume as ref_resume
from torch_impl import resume as t_resume

IMPLS = {"reference": (ref_resume, small_reference_state),
         "torch": (t_resume, small_torch_state)}


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> tuple[ModuleType, Callable[..., dict]]:
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


def test_both_trees_raise_the_one_error_family() -> None:
    """Every error class either tree exports is ckpt's own class, under one base."""
    names = [n for n in dir(ckpt) if n.startswith("Checkpoint") and n.endswith("Error")]
    assert len(names) == 7
    for name in names:
        assert getattr(ref_resume, name) is getattr(t_resume, name) is getattr(ckpt, name)
        assert issubclass(getattr(ckpt, name), ckpt.CheckpointError)


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
                              st.sampled_from([0, 1, 51, 52, len(blob) - 40, len(blob) - 1])))
    event("cut inside the trailer" if cut >= len(blob) - 40 else "cut before it")
    path = tmp_path / f"cut-{cut}.ckpt"
    path.write_bytes(blob[:cut])
    with pytest.raises(mod.CheckpointCorruptError):
        mod.load_checkpoint(path)


@pytest.mark.parametrize("name", sorted(IMPLS))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bit_flip_is_detected(name: str, saved: dict, tmp_path: Path,
                                  data: st.DataObject) -> None:
    """Flipping any one bit anywhere (magic, header, payload, length, digest) is corrupt."""
    mod, _ = IMPLS[name]
    blob = bytearray(saved[name])
    pos = data.draw(st.integers(0, len(blob) - 1))
    bit = data.draw(st.integers(0, 7))
    blob[pos] ^= 1 << bit
    header_end = 12 + struct.unpack("<I", bytes(saved[name][8:12]))[0]
    event("magic/length" if pos < 12 else "header" if pos < header_end
          else "trailer" if pos >= len(blob) - 40 else "payload")
    path = tmp_path / f"flip-{pos}-{bit}.ckpt"
    path.write_bytes(bytes(blob))
    with pytest.raises(mod.CheckpointCorruptError):
        mod.load_checkpoint(path)


@pytest.mark.parametrize("extra", [1, 2**40])
def test_an_extended_checkpoint_is_refused_before_its_body_is_read(
        impl: tuple, tmp_path: Path, extra: int) -> None:
    """A checkpoint grown by 1 byte or 1 TiB (sparse) is corrupt at once: its lengths do not
    add up, found from the first 12 and last 40 bytes (reading 1 TiB would take minutes)."""
    mod, make = impl
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make())
    os.truncate(path, path.stat().st_size + extra)
    start = time.perf_counter()
    with pytest.raises(mod.CheckpointCorruptError, match="do not add up"):
        mod.load_checkpoint(path)
    assert time.perf_counter() - start < 5.0


def test_a_fifo_is_refused_without_blocking(impl: tuple, tmp_path: Path) -> None:
    """Loading a FIFO (no writer on the other end) raises at once instead of hanging."""
    mod, _ = impl
    fifo = tmp_path / "a.ckpt"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            mod.load_checkpoint(fifo)
        except BaseException as e:  # handed to the main thread
            outcome.append(e)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "load_checkpoint blocked on a FIFO"
    assert isinstance(outcome[0], mod.CheckpointCorruptError) and "FIFO" in str(outcome[0])


@pytest.mark.parametrize("version", [1, 2, 4])
def test_another_format_version_is_a_version_error(impl: tuple, saved: dict, tmp_path: Path,
                                                   version: int) -> None:
    """A well-formed checkpoint whose header says version 1, 2 (in the version-3 frame) or 4
    is refused with CheckpointVersionError."""
    mod, _ = impl
    path = tmp_path / "v.ckpt"
    path.write_bytes(recontainer(saved["reference" if mod is ref_resume else "torch"],
                                 version=version))
    with pytest.raises(mod.CheckpointVersionError, match=f"version {version}"):
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


def test_a_changed_configuration_names_each_differing_field() -> None:
    """check_config: one phrase per field, the checkpoint's value first, in one line."""
    saved = {"precision": "fp32", "seed": 0, "horizon": 200}
    with pytest.raises(ckpt.CheckpointMismatchError) as info:
        ckpt.check_config(saved, {**saved, "precision": "bf16", "horizon": 60})
    message = str(info.value)
    assert "horizon: 200 in the checkpoint, 60 now" in message
    assert "precision: 'fp32' in the checkpoint, 'bf16' now" in message
    assert "seed" not in message and "\n" not in message
    ckpt.check_config(saved, dict(saved))
