"""torch_impl.resume against documented torch behaviour: torch.load's blind spots, covered.

1. torch.load does not verify its zip CRCs: a flipped byte in a tensor's data loads as a
   different value without an error (the reason for the outer digest).
2. torch.load(weights_only=False) runs a crafted pickle's code (a marker appears); the
   checkpoint loader, with a valid digest around the same payload, refuses it and the
   marker never appears.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
import torch

import ckpt
from torch_impl import resume


class _Payload:
    """Unpickling this calls os.mkdir(marker): the stand-in for arbitrary code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.marker,))


def test_torch_load_alone_returns_a_flipped_tensor_byte_silently() -> None:
    """torch.save -> flip one data byte -> torch.load succeeds with a different value."""
    t = torch.arange(1024, dtype=torch.float32)
    buf = io.BytesIO()
    torch.save({"w": t}, buf)
    blob = bytearray(buf.getvalue())
    at = bytes(blob).find(t.numpy().tobytes())
    assert at > 0, "tensor bytes not found in the archive"
    blob[at + 4 * 100 + 2] ^= 0x01  # element 100, a mantissa bit
    loaded = torch.load(io.BytesIO(bytes(blob)), weights_only=True)["w"]
    assert not torch.equal(loaded, t) and loaded[100] != t[100]


def test_the_same_flip_inside_a_checkpoint_is_detected(tmp_path: Path) -> None:
    """With the digest around the payload, that flip is a CheckpointCorruptError."""
    t = torch.arange(1024, dtype=torch.float32)
    path = tmp_path / "a.ckpt"
    resume.save_checkpoint(path, {"w": t})
    blob = bytearray(path.read_bytes())
    blob[bytes(blob).find(t.numpy().tobytes()) + 4 * 100 + 2] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(resume.CheckpointCorruptError, match="XXH3-128"):
        resume.load_checkpoint(path)


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    """A valid-digest checkpoint whose torch payload pickles code: CheckpointUnsafeError, no run."""
    marker = tmp_path / "payload-ran"
    buf = io.BytesIO()
    torch.save({"model": _Payload(str(marker))}, buf)
    payload = buf.getvalue()
    path = tmp_path / "evil.ckpt"
    path.write_bytes(ckpt.encode_container(payload, resume.PAYLOAD, resume.WRITER))
    with pytest.raises(resume.CheckpointUnsafeError, match="refused"):
        resume.load_checkpoint(path)
    assert not marker.exists()
    # guard: the payload is live; a plain torch.load(weights_only=False) runs it
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.is_dir()


def test_generator_states_round_trip_and_replay_the_stream(tmp_path: Path) -> None:
    """A saved torch.Generator state restores the exact same next draws."""
    g = torch.Generator().manual_seed(123)
    torch.rand(10, generator=g)
    resume.save_checkpoint(tmp_path / "g.ckpt", {"rng": g.get_state()})
    expected = torch.rand(100, generator=g)
    h = torch.Generator()
    h.set_state(resume.load_checkpoint(tmp_path / "g.ckpt")["rng"])
    assert torch.equal(torch.rand(100, generator=h), expected)


def test_tensors_saved_on_the_device_load_on_the_cpu_bit_for_bit(tmp_path: Path,
                                                                 device: str) -> None:
    """A checkpoint of device tensors loads with map_location="cpu": same dtype, shape, bits."""
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(64, 8, generator=g).to(device),
             "h": torch.randn(5, generator=g).half().to(device)}
    resume.save_checkpoint(tmp_path / "d.ckpt", state)
    loaded = resume.load_checkpoint(tmp_path / "d.ckpt")
    for key, value in state.items():
        assert loaded[key].device.type == "cpu"
        assert torch.equal(loaded[key], value.cpu()) and loaded[key].dtype == value.dtype


@pytest.mark.parametrize("failing", [False, True], ids=["saved", "write failed"])
def test_the_payload_is_hashed_once_and_torchs_crc32_setting_is_restored(
        tmp_path: Path, failing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch payload carries no CRC-32s (the digest covers its bytes once), it loads
    bit for bit, and the process-wide CRC-32 switch is back as it was, even after a failed
    save."""
    t = torch.arange(1024, dtype=torch.float32)
    path = tmp_path / "a.ckpt"
    plain = io.BytesIO()
    torch.save({"w": t}, plain)  # with CRC-32s, as torch.save writes by default
    assert torch.serialization.get_crc32_options()
    if failing:  # the disk fills up inside torch.save, after the container's header
        write, calls = os.write, []

        def full(fd: int, data: bytes) -> int:
            calls.append(len(data))
            if len(calls) == 1:
                return write(fd, data)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt.atomic.os, "write", full)
        with pytest.raises(resume.CheckpointWriteError, match="No space"):
            resume.save_checkpoint(path, {"w": t})
        assert torch.serialization.get_crc32_options()
        assert len(calls) >= 2  # the guard: the header was written, torch.save failed
        return
    resume.save_checkpoint(path, {"w": t})
    assert torch.serialization.get_crc32_options()
    with ckpt.open_checkpoint(path) as c:
        payload = bytes(c.payload)
    # The zip's central directory holds each record's CRC-32 at offset 16 of its entry.
    crcs = [payload[i + 16:i + 20] for i in range(len(payload))
            if payload.startswith(b"PK\x01\x02", i)]
    plain_crcs = [plain.getvalue()[i + 16:i + 20] for i in range(len(plain.getvalue()))
                  if plain.getvalue().startswith(b"PK\x01\x02", i)]
    assert crcs and all(c == bytes(4) for c in crcs)
    assert any(c != bytes(4) for c in plain_crcs)  # the guard: torch.save does write them
    assert torch.equal(resume.load_checkpoint(path)["w"], t)
