"""The commit record's contracts (ckpt/commit.py) and the torch tree's sharded checkpoint in
one process (torch_impl/sharded_ckpt.py): bad input gets a clear error, nothing is
unpickled before the digests match, and the hazard the commit record exists for: plain DCP
saved into a directory that holds a checkpoint, interrupted before its .metadata, loads a
mix of two steps. The multi-process claims: parity/test_ddp_ckpt.py.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from ckpt import (  # noqa: E402
    CheckpointCorruptError,
    CheckpointDirectoryError,
    CheckpointVersionError,
)
from ckpt import commit as ckc  # noqa: E402
from torch_impl import sharded_ckpt as sc  # noqa: E402


def _state(step: int) -> dict[str, torch.Tensor]:
    """Four tensors whose values say the step they were saved at."""
    return {f"t{i}": torch.full((3,), float(step * 10 + i)) for i in range(4)}


def _like() -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in _state(0).items()}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """Committed single-process checkpoints at steps 2 and 4."""
    for step in (2, 4):
        sc.save_sharded(tmp_path, step, _state(step), rank=0)
    return tmp_path


def test_a_committed_checkpoint_loads_the_newest_step(saved: Path) -> None:
    """The newest verified commit, its files as the record lists them."""
    out = _like()
    record, skipped = sc.load_sharded(saved, out)
    assert (record.step, record.world_size, skipped) == (4, 1, [])
    assert all(torch.equal(out[k], v) for k, v in _state(4).items())
    assert {f.name for f in record.files} == {"__0_0.distcp", ".metadata"}


def test_a_record_naming_a_missing_file_is_passed_over_for_the_previous_one(
        saved: Path) -> None:
    """Step 4's data file removed: step 2 loads, the reason names the missing file."""
    (ckc.step_dir(saved, 4) / "__0_0.distcp").unlink()
    out = _like()
    record, skipped = sc.load_sharded(saved, out)
    assert record.step == 2 and torch.equal(out["t0"], _state(2)["t0"])
    assert len(skipped) == 1 and "__0_0.distcp is missing" in skipped[0]


def test_a_digest_mismatch_is_refused_naming_the_file(saved: Path) -> None:
    """One byte changed (same size) in every step's data file: nothing loads, each file
    named."""
    for step in (2, 4):
        path = ckc.step_dir(saved, step) / "__0_0.distcp"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 1
        path.write_bytes(bytes(raw))
    mismatch = re.escape("__0_0.distcp's SHA-256 does not match")
    with pytest.raises(CheckpointDirectoryError, match=mismatch):
        sc.load_sharded(saved, _like())
    with pytest.raises(CheckpointCorruptError, match="SHA-256"):
        ckc.verify(ckc.read_record(ckc.record_path(saved, 4)))


def test_a_record_that_omits_a_file_its_metadata_uses_is_refused(saved: Path) -> None:
    """A record listing only .metadata verifies, but DCP would read an unverified file."""
    path = ckc.record_path(saved, 4)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "files": [f for f in data["files"]
                                                  if f["name"] == ".metadata"]}))
    with pytest.raises(CheckpointCorruptError, match=re.escape("does not list ['__0_0.distcp']")):
        sc.load_sharded(saved, _like())


def test_a_size_mismatch_is_refused_before_hashing(saved: Path) -> None:
    with open(ckc.step_dir(saved, 4) / "__0_0.distcp", "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointCorruptError, match="the commit record says"):
        ckc.verify(ckc.read_record(ckc.record_path(saved, 4)))


def test_a_foreign_or_uncommitted_directory_is_refused(tmp_path: Path) -> None:
    """A directory of other files, a plain DCP checkpoint without a record, a missing path."""
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(CheckpointDirectoryError, match=re.escape("no COMMITTED-<step>.json")):
        sc.load_sharded(tmp_path, _like())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", sc.ONE_PROCESS_WARNING, UserWarning)
        warnings.filterwarnings("ignore", sc.TYPED_STORAGE_WARNING, UserWarning)
        dcp.save(_state(1), checkpoint_id=tmp_path / "step-00000001", **sc.no_dist_kwargs())
    with pytest.raises(CheckpointDirectoryError, match="no committed sharded checkpoint"):
        sc.load_sharded(tmp_path, _like())
    assert ckc.uncommitted(tmp_path) == [tmp_path / "step-00000001"]
    with pytest.raises(CheckpointDirectoryError, match="not a directory"):
        sc.load_sharded(tmp_path / "absent", _like())


def test_a_malformed_record_is_corrupt_and_passed_over(saved: Path) -> None:
    """A name that leaves the directory, no files, a step not its name's, world size 0,
    another format, a negative size: CheckpointCorruptError, and the loader takes step 2."""
    path = ckc.record_path(saved, 4)
    good = json.loads(path.read_text())
    for change in ({"files": [{"name": "../escape", "size": 1, "sha256": "0" * 64}]},
                   {"files": []}, {"step": 3}, {"world_size": 0}, {"format": "other"},
                   {"files": [{"name": "a", "size": -1, "sha256": "0" * 64}]}):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointCorruptError):
            ckc.read_record(path)
        record, skipped = sc.load_sharded(saved, _like())
        assert record.step == 2 and len(skipped) == 1, change
    path.write_text("{not json")
    with pytest.raises(CheckpointCorruptError, match="not JSON"):
        ckc.read_record(path)


def test_a_record_of_the_size_limit_reads_and_one_byte_more_is_refused(saved: Path) -> None:
    """MAX_RECORD_BYTES is the largest record read, to its last byte (its JSON led by spaces
    up to it, the closing brace last); one byte past it is CheckpointCorruptError before a
    byte is parsed, and the loader takes step 2."""
    path = ckc.record_path(saved, 4)
    text = path.read_text().strip()
    for size in (ckc.MAX_RECORD_BYTES, ckc.MAX_RECORD_BYTES + 1):
        path.write_text(text.rjust(size))
        assert path.stat().st_size == size
        if size == ckc.MAX_RECORD_BYTES:
            assert ckc.read_record(path).step == 4
            continue
        with pytest.raises(CheckpointCorruptError, match="larger than"):
            ckc.read_record(path)
        record, skipped = sc.load_sharded(saved, _like())
        assert record.step == 2 and len(skipped) == 1


def test_another_version_or_payload_is_named(saved: Path) -> None:
    path = ckc.record_path(saved, 4)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "version": 99}))
    with pytest.raises(CheckpointVersionError, match="version 99"):
        ckc.read_record(path)
    path.write_text(json.dumps({**data, "payload": "npy-records"}))
    record, skipped = sc.load_sharded(saved, _like())
    assert record.step == 2 and "payload 'npy-records', expected 'dcp'" in skipped[0]


def test_saves_go_only_into_a_fresh_step_directory_and_only_tensors(saved: Path) -> None:
    with pytest.raises(CheckpointDirectoryError, match="fresh step directory"):
        sc.save_sharded(saved, 4, _state(4), rank=0)
    with pytest.raises(TypeError, match="every entry must be a tensor"):
        sc.save_sharded(saved, 6, {"step": 6}, rank=0)  # type: ignore[dict-item]
    for bad in (-1, True, 10**8, 2.0):
        with pytest.raises(ValueError, match="step must be an int"):
            ckc.step_dir(saved, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank_seed"):
        ckc.rank_seed(0, -1, 4)
    with pytest.raises(ValueError, match="fault's point"):
        sc.ckpt_job(_config(), 4, 2, str(saved), 2, fault=("elsewhere", 0, 4))


def _config():
    from parity.drivers.ddp_ckpt import config

    return config()


class _Marker:
    """Unpickling it creates a directory: code run by pickle.load."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.path),))


def test_nothing_is_unpickled_before_the_digests_match(saved: Path, tmp_path: Path) -> None:
    """A .metadata replaced by a pickle that runs code: load_sharded refuses it by its digest
    and the code never runs; DCP's own reader runs it (torch 2.13's read_metadata is
    pickle.load: the hazard is real)."""
    marker = tmp_path / "code-ran"
    for step in (2, 4):  # the same size (pickle.load stops at its STOP opcode): only the
        path = ckc.step_dir(saved, step) / ".metadata"  # digest can tell
        evil = pickle.dumps(_Marker(marker))
        path.write_bytes(evil + b" " * (path.stat().st_size - len(evil)))
    with pytest.raises(CheckpointDirectoryError, match=re.escape(".metadata's SHA-256")):
        sc.load_sharded(saved, _like())
    assert not marker.exists()
    with pytest.raises(BaseException):  # noqa: B017  the unpickled marker is no Metadata
        dcp.FileSystemReader(ckc.step_dir(saved, 4)).read_metadata()
    assert marker.exists()


class _KilledWriter(dcp.FileSystemWriter):
    """A FileSystemWriter (one file per tensor) that dies after writing `files` data files,
    before any .metadata: what a SIGKILL mid-save leaves."""

    def __init__(self, path: Path, files: int) -> None:
        super().__init__(path, single_file_per_rank=False, thread_count=1)
        left = [files]
        create = self.fs.create_stream

        def create_stream(p: object, mode: str):
            if str(p).endswith(".distcp"):
                if left[0] == 0:
                    raise OSError("killed mid-save")
                left[0] -= 1
            return create(p, mode)

        self.fs.create_stream = create_stream  # type: ignore[method-assign]


def test_plain_dcp_into_an_existing_directory_tears_and_loads_a_mix_of_two_steps(
        tmp_path: Path) -> None:
    """Step 1 saved, then step 2 into the same directory killed after 2 of its 4 data files:
    step 1's .metadata survives and dcp.load returns t0, t1 from step 2 and t2, t3 from step
    1, without a word; the commit-based loader finds no checkpoint there."""
    directory = tmp_path / "plain"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", sc.ONE_PROCESS_WARNING, UserWarning)
        warnings.filterwarnings("ignore", sc.TYPED_STORAGE_WARNING, UserWarning)
        warnings.filterwarnings("ignore", "Detected an existing checkpoint", UserWarning)
        dcp.save(_state(1), storage_writer=dcp.FileSystemWriter(
            directory, single_file_per_rank=False, thread_count=1), **sc.no_dist_kwargs())
        with pytest.raises(BaseException, match="killed mid-save"):  # CheckpointException
            dcp.save(_state(2), storage_writer=_KilledWriter(directory, 2), **sc.no_dist_kwargs())
        out = _like()
        dcp.load(out, checkpoint_id=directory, **sc.no_dist_kwargs())
    came_from = {k: [s for s in (1, 2) if torch.equal(v, _state(s)[k])] for k, v in out.items()}
    assert came_from == {"t0": [2], "t1": [2], "t2": [1], "t3": [1]}, came_from
    with pytest.raises(CheckpointDirectoryError):
        sc.load_sharded(tmp_path, _like())


def test_the_reference_refuses_bad_world_sizes_and_records_of_other_files(tmp_path: Path) -> None:
    """reference.sharded_ckpt: world_size >= 1; a record must list exactly rank-<r>.ckpt."""
    import numpy as np

    from reference import sharded_ckpt as ref

    states = [{"step": np.array(2), "rng/rank0": np.arange(3)},
              {"step": np.array(2), "rng/rank1": np.arange(3) + 1}]
    ref.save_sharded(tmp_path, 2, states)
    with pytest.raises(ValueError, match="world_size"):
        ref.load_sharded(tmp_path, 0, 0)
    with pytest.raises(ValueError, match="at least one rank"):
        ref.save_sharded(tmp_path, 4, [])
    _, same = ref.load_sharded(tmp_path, 2, 0)
    assert [sorted(s) for s in same] == [["rng/rank0", "step"], ["rng/rank1", "step"]]
    _, three = ref.load_sharded(tmp_path, 3, 7)
    assert [s["rng/rank2"] for s in three[2:]] == [ref.rank_stream(7, 2, 2)]
    assert ref.rank_stream(7, 2, 2) != ref.rank_stream(7, 1, 2)
    path = ckc.record_path(tmp_path, 2)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "files": data["files"][:1]}))
    with pytest.raises(CheckpointCorruptError, match="expected"):
        ref.load_sharded(tmp_path, 2, 0)
