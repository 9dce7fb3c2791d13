"""The container's digest (ckpt/digest.py, NOTE [ Container digest ]) and its frames
(NOTE [ Checkpoint file layout ]): what a version-3 seal is, for writes of any sizes; that
version-2 files (piecewise SHA-256) still load and verify, and nothing else passes for
one; that a digest this code does not know is refused by name; that the digest computed
while the payload decodes is always waited for.

Flipped bits, truncations and foreign files under the new digest: tests/test_resume_files.py.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import struct
import threading
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ckpt
from ckpt import atomic, container, digest
from parity.drivers.resume import flatten, small_reference_state, small_torch_state
from parity.strategies import examples
from reference import resume as ref_resume
from torch_impl import resume as t_resume

IMPLS = {"reference": (ref_resume, small_reference_state),
         "torch": (t_resume, small_torch_state)}
# XXH3-128 of the empty input, from xxHash's own test vectors (xxhsum -H2 of an empty file)
XXH3_128_EMPTY = bytes.fromhex("99aa06d3014798d86001c324468d497f")


@pytest.fixture(params=sorted(IMPLS))
def impl(request: pytest.FixtureRequest) -> tuple:
    return IMPLS[request.param]


def _piecewise_sha256(data: bytes, piece: int = 1 << 20) -> bytes:
    """NOTE [ Piecewise digest ] written out: SHA-256 over the SHA-256s of the pieces."""
    pieces = [data[i:i + piece] for i in range(0, len(data), piece)] or [b""]
    return hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in pieces)).digest()


def _version_2(mod: ModuleType, state: dict, *, version: int = 2) -> bytes:
    """A version-2 container, as the SHA-256 code wrote them, built here byte by byte."""
    buf = io.BytesIO()
    mod.write_state(state, buf)
    header = json.dumps({"format": ckpt.FORMAT, "version": version, "payload": mod.PAYLOAD,
                         "writer": mod.WRITER}, sort_keys=True).encode()
    body = (b"\x89MTCKPT\n" + struct.pack("<I", len(header)) + header + buf.getvalue()
            + struct.pack("<Q", len(buf.getvalue())))
    return body + _piecewise_sha256(body)


def test_xxh3_128_is_the_algorithm_of_its_published_test_vector() -> None:
    """The digest the container uses is XXH3-128, not another xxhash of the same width."""
    assert digest.xxh3_128(b"") == XXH3_128_EMPTY
    assert digest.digest_of(b"")[16:] == digest.xxh3_128(b"xxh3-128" + bytes(8))


@settings(examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=6))
def test_the_seal_is_the_name_and_the_xxh3_128_of_every_byte_before_it_for_any_writes(
        data: bytes, cuts: list[int], tmp_path: Path) -> None:
    """A container streamed in writes of any sizes ends in b"xxh3-128", 8 NULs and the
    one-shot XXH3-128 of every byte before the digest, the name included."""
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    event(f"writes: {min(len(bounds) - 1, 3)}+")
    path = tmp_path / "s.ckpt"

    def payload(out: atomic.HashingWriter) -> None:
        for lo, hi in itertools.pairwise(bounds):
            out.write(data[lo:hi])

    ckpt.save_container(path, "raw", "test", payload)
    blob = path.read_bytes()
    assert blob[-32:-16] == b"xxh3-128" + bytes(8)
    assert blob[-16:] == digest.xxh3_128(blob[:-16])
    assert blob[:8] == b"\x89MTCKP3\n" and blob[-40 - len(data):-40] == data
    assert blob[:-32] + digest.digest_of(blob[:-32]) == blob


def test_version_2_containers_still_load_and_verify(impl: tuple, tmp_path: Path) -> None:
    """A piecewise-SHA-256 file whose body spans several 1 MiB pieces loads to the state it
    holds in both trees; a flipped bit in it is corrupt, named as a SHA-256 mismatch."""
    mod, make = impl
    state = make()
    big = np.arange(3 << 17, dtype=np.float32)  # 1.5 MiB: the digest has two pieces
    state["model"]["big"] = big if mod is ref_resume else torch.from_numpy(big)
    blob = _version_2(mod, state)
    assert len(blob) > 1 << 20
    path = tmp_path / "old.ckpt"
    path.write_bytes(blob)
    loaded = mod.load_checkpoint(path)
    expected, got = flatten(state), flatten(loaded)
    assert expected.keys() == got.keys()
    assert all(np.array_equal(expected[k], got[k]) for k in expected)
    with ckpt.open_checkpoint(path) as c:
        assert c.header["version"] == 2
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(mod.CheckpointCorruptError, match="SHA-256"):
        mod.load_checkpoint(path)


def test_a_version_3_file_never_passes_for_version_2(impl: tuple, tmp_path: Path) -> None:
    """A version-3 file given version 2's magic fails version 2's SHA-256; a version-2 frame
    with a valid SHA-256 whose header says version 3 is refused as that version."""
    mod, make = impl
    path = tmp_path / "a.ckpt"
    mod.save_checkpoint(path, make())
    path.write_bytes(b"\x89MTCKPT\n" + path.read_bytes()[8:])
    with pytest.raises(mod.CheckpointCorruptError, match="SHA-256"):
        mod.load_checkpoint(path)
    path.write_bytes(_version_2(mod, make(), version=3))
    for load in (mod.load_checkpoint, ckpt.open_checkpoint):
        with pytest.raises(mod.CheckpointVersionError, match="version 3 in a version-2 frame"):
            load(path)


@pytest.mark.parametrize("name", [b"blake3", b"xxh3-128\x00\x00\x00\x00\x00\x00\x00\x01",
                                  b"\xff" * 16])
def test_a_digest_this_code_does_not_know_is_refused_naming_it(impl: tuple, tmp_path: Path,
                                                               name: bytes) -> None:
    """A seal naming another digest (followed by the XXH3-128 it would pass) cannot be
    verified: CheckpointCorruptError naming it, in both loaders and the directory."""
    mod, make = impl
    path = tmp_path / "ckpt-00000001.ckpt"
    mod.save_checkpoint(path, make(), meta={"step": 1, "config": {}})
    body = path.read_bytes()[:-32] + name.ljust(16, b"\0")
    path.write_bytes(body + digest.xxh3_128(body))
    shown = repr(name.decode()) if name.isascii() and name.decode().isprintable() else repr(
        name.ljust(16, b"\0"))
    for load in (mod.load_checkpoint, ckpt.open_checkpoint):
        with pytest.raises(mod.CheckpointCorruptError, match="digest " + shown.replace(
                "\\", "\\\\").replace("(", r"\(")):
            load(path)
    entry = ckpt.directory.read_entry(path, 1)
    assert entry.header is None and not entry.verified and "cannot verify" in entry.problem


@pytest.mark.parametrize("helper", [False, True], ids=["inline", "helper-thread"])
def test_a_digest_that_finishes_after_the_decode_is_still_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helper: bool) -> None:
    """The digest is made to finish only after the payload has decoded, on the loading
    thread (a small file) and on the helper thread (every file, with INLINE_DIGEST at 0): a
    wrong digest is still a CheckpointCorruptError, never the decoded state."""
    if helper:
        monkeypatch.setattr(container, "INLINE_DIGEST", 0)
    path = tmp_path / "a.ckpt"
    ckpt.save_container(path, "raw", "test", lambda out: out.write(b"payload"))
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0x01  # the digest itself: the payload decodes fine
    path.write_bytes(bytes(blob))
    decoded, late = threading.Event(), []
    real = digest.xxh3_128

    def slow_digest(view: memoryview) -> bytes:
        late.append(decoded.wait(timeout=10))  # after the decode, or after 10 s
        return real(view)

    def decode(payload: memoryview, where: str) -> dict:
        state = {"payload": bytes(payload)}
        decoded.set()
        return state

    monkeypatch.setattr(digest, "xxh3_128", slow_digest)
    with pytest.raises(ckpt.CheckpointCorruptError, match="XXH3-128"):
        container.load_container(path, "raw", decode, "")
    assert late == [True]  # the digest really was computed after the decode finished


@settings(examples(30), deadline=None)
@given(data=st.binary(max_size=700), piece=st.sampled_from([1, 7, 64, 256]))
def test_version_2_digest_is_the_piecewise_formula(data: bytes, piece: int) -> None:
    """The kept SHA-256 reader computes NOTE [ Piecewise digest ] (small pieces stand in for
    1 MiB): pieces ending on a boundary, one piece, several."""
    event(f"pieces: {'one' if len(data) <= piece else 'several'}, "
          f"ends on a boundary: {len(data) % piece == 0}")
    original = digest.PIECE
    digest.PIECE = piece
    try:
        assert digest.sha256_piecewise(data) == _piecewise_sha256(data, piece)
    finally:
        digest.PIECE = original
