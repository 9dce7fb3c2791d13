"""reference.resume: what NumPy's own loader would do with a hostile file, and refusing it.

A crafted checkpoint with a VALID digest whose array record is an object array: unpickling
it runs the attacker's `__reduce__` (a guard shows that it does, creating a marker); the
reference's loader refuses it (allow_pickle=False) and the marker never appears.
"""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st

import ckpt
from parity.strategies import examples
from reference import resume


class _Payload:
    """Unpickling this calls os.mkdir(marker): the stand-in for arbitrary code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.marker,))


def _hostile_payload(marker: Path) -> bytes:
    skeleton = json.dumps({"model": {"__array__": 0}}).encode()
    buf = io.BytesIO()
    buf.write(struct.pack("<Q", len(skeleton)) + skeleton)
    np.lib.format.write_array(buf, np.array([_Payload(str(marker))], dtype=object),
                              allow_pickle=True)
    return buf.getvalue()


def test_a_pickled_object_array_is_refused_and_never_runs(tmp_path: Path) -> None:
    """A valid-digest checkpoint with an object array: CheckpointUnsafeError, no code runs."""
    marker = tmp_path / "payload-ran"
    payload = _hostile_payload(marker)
    path = tmp_path / "evil.ckpt"
    path.write_bytes(ckpt.encode_container(payload, resume.PAYLOAD, resume.WRITER))
    with pytest.raises(resume.CheckpointUnsafeError, match="pickle"):
        resume.load_checkpoint(path)
    assert not marker.exists()
    # guard: the payload is live, so the refusal above is what kept it from running
    buf = io.BytesIO(payload)
    buf.seek(8 + struct.unpack("<Q", payload[:8])[0])
    np.lib.format.read_array(buf, allow_pickle=True)
    assert marker.is_dir()


def test_numpy_scalars_and_zero_d_arrays_keep_their_kind(tmp_path: Path) -> None:
    """np.float32(x) comes back as np.float32 and a 0-d array as a 0-d array (step counters)."""
    state = {"scalar": np.float32(2.5), "zero_d": np.array(3.0, dtype=np.float32),
             "ints": {0: np.int64(7)}, "big": 2**127 + 1, "nan": float("nan")}
    resume.save_checkpoint(tmp_path / "a.ckpt", state)
    back = resume.load_checkpoint(tmp_path / "a.ckpt")
    assert type(back["scalar"]) is np.float32 and back["scalar"] == np.float32(2.5)
    assert isinstance(back["zero_d"], np.ndarray) and back["zero_d"].shape == ()
    assert type(back["ints"][0]) is np.int64 and back["big"] == 2**127 + 1
    assert np.isnan(back["nan"])


_HEADER_DTYPES = ("?", "i1", "<u2", ">i4", "<u8", "<f2", ">f4", "<f8", "<c16", ">c8")


@settings(examples(60), deadline=None)
@given(dtype=st.sampled_from(_HEADER_DTYPES),
       shape=st.lists(st.integers(0, 12), max_size=4).map(tuple), fortran=st.booleans())
def test_record_headers_read_as_numpy_reads_them(
        dtype: str, shape: tuple[int, ...], fortran: bool) -> None:
    """The reference's record-header reader (NOTE [ Record headers ]) gives numpy's own
    (shape, fortran_order, dtype) and leaves the reader where numpy's leaves the file, for
    headers numpy writes: 0-d to 4-d, either order, either byte order."""
    a = np.zeros(shape, dtype=dtype, order="F" if fortran else "C")
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, a, version=(1, 0))
    blob = buffer.getvalue()
    buffer.seek(0)
    assert np.lib.format.read_magic(buffer) == (1, 0)
    expected = np.lib.format.read_array_header_1_0(buffer)
    length = struct.unpack_from("<H", blob, 8)[0]
    fast = resume._HEADER.fullmatch(blob[10:10 + length]) is not None
    event(f"read by the reference's own pattern: {fast}")
    target(float(fast), label="headers on the fast path")
    reader = ckpt.ViewReader(memoryview(blob))
    assert resume._record_header(reader) == expected
    assert reader.tell() == buffer.tell()
