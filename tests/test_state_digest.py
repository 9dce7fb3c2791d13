"""The canonical digest (NOTE [ Canonical state digest ] in common/state_digest.py) of the
dtypes NumPy has no type for: torch's bfloat16 and float8 tensors against the reference's
ml_dtypes arrays of the same values, and the record's bytes written out from the NOTE.
"""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np
import pytest
import torch

from reference import state_digest as ref_digest
from torch_impl import state_digest as t_digest

DTYPES = {"bfloat16": (torch.bfloat16, ml_dtypes.bfloat16),
          "float8_e4m3fn": (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
          "float8_e5m2": (torch.float8_e5m2, ml_dtypes.float8_e5m2)}


def _state(weight: object) -> dict:
    return {"model": {"w": weight}, "optimizer": {"state": {}}, "scaler": {},
            "data": {"epoch": 0, "position": 3}}


def _values() -> np.ndarray:  # in range of every format, ties and subnormals among them
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0, 4, 61), [0.0, -0.0, 2.0**-9, 1.0 + 2.0**-8]]
                          ).astype(np.float32).reshape(5, 13)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_a_torch_tensor_digests_as_the_reference_array_of_its_values(name: str) -> None:
    torch_dtype, np_dtype = DTYPES[name]
    x = _values()
    theirs = t_digest.state_digest(_state(torch.from_numpy(x).to(torch_dtype)))
    ours = ref_digest.state_digest(_state(x.astype(np_dtype)))
    assert theirs == ours


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_the_record_names_the_format_and_carries_its_bits(name: str) -> None:
    x = _values().astype(DTYPES[name][1])
    raw = x.tobytes()  # little-endian on every machine NumPy's ml_dtypes run on
    h = hashlib.sha256()
    for rec in (f"model/w\x00{name}\x005,13\x00".encode() + raw,
                b"data/epoch\x00py\x000", b"data/position\x00py\x003"):
        h.update(struct.pack("<Q", len(rec)) + rec)
    assert ref_digest.state_digest(_state(x)) == h.hexdigest()


def test_the_same_bytes_in_another_format_digest_otherwise() -> None:
    bits = np.arange(64, dtype=np.uint8).reshape(8, 8)
    digests = {ref_digest.state_digest(_state(bits.view(d)))
               for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.uint8, np.int8)}
    assert len(digests) == 4
