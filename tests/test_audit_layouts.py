"""What `python -m parity audit` says of a folder that is no checkpoint it knows (an unknown
layout: exit 2, listing what it holds) and of a checkpoint a crash cut short (a half-written
save: named so, exit 1), per client: a Trainer folder without the trainer_state.json it
writes last, a DCP folder without the .metadata it writes last."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from parity.lab.cli import EXIT_FAILED, EXIT_USAGE
from tests.test_audit import audit
from tests.test_audit_dcp import saved
from tests.test_audit_hf import trainer_folder


def test_an_unknown_layout_lists_what_it_found_and_what_audit_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files of no known layout: exit 2, one line naming each file (the first 8, then the
    count) and each layout audit reads."""
    for i in range(10):
        (tmp_path / f"weights-{i}.npz").write_bytes(b"")
    status, report, err = audit(tmp_path, capsys)
    assert (status, report) == (EXIT_USAGE, {})
    line = err.strip()
    assert "\n" not in line and "unknown layout: it holds weights-0.npz, " in line
    assert "weights-7.npz, ... (10 in all)" in line and "weights-8" not in line
    for layout in ("Trainer checkpoint folder", "Accelerate save_state folder",
                   "torch.distributed.checkpoint folder", "torch.save file"):
        assert layout in line, layout


@pytest.mark.parametrize(("make", "kind", "words"), [
    (lambda p: trainer_folder(p / "checkpoint-4"), "Hugging Face Trainer checkpoint",
     "a half-written Trainer checkpoint: no trainer_state.json"),
    (lambda p: saved(p / "dcp"), "torch.distributed.checkpoint (DCP) folder, half-written",
     "a half-written DCP checkpoint: 1 shard file(s) (__0_0.distcp) and no .metadata")],
    ids=["trainer", "dcp"])
def test_a_save_cut_before_its_last_file_is_named_half_written(
        make: Callable[[Path], Path], kind: str, words: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without the file its library writes last, a folder is a save that did not finish:
    exit 1, the reason says so, and names the crash."""
    folder = make(tmp_path)
    (folder / ("trainer_state.json" if kind.startswith("Hugging") else ".metadata")).unlink()
    status, report, _ = audit(folder, capsys)
    assert (status, report["kind"]) == (EXIT_FAILED, kind)
    assert report["refused"].startswith(words) and "a crash mid-save" in report["refused"]
