"""`python -m parity audit` on torch.distributed.checkpoint folders written here by torch's own
`dcp.save` (one process, no process group: `no_dist=True`; 0.03 s on a tiny model): the
folder read by its .metadata without running it, the item names as torch's own reader gives
them, a lone shard file, a folder without its .metadata (a crash mid-save), a shard
.metadata names gone, and a crafted .metadata whose payload must not run.
tests/test_audit_dcp_resume.py holds the verdicts to a resume with `dcp.load`."""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from parity.lab.audit_dcp import item_names, read_metadata
from parity.lab.audit_recognize import PRESENT
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from tests.test_audit import audit, rows


def user_state(full: bool = True) -> dict[str, Any]:
    """What a user hands dcp.save after 4 steps: model and optimizer, and (full) the
    scheduler, the torch RNG, the step, epoch and samples consumed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    for _ in range(4):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        cosine.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    if full:
        state.update(sched=cosine.state_dict(), rng=torch.get_rng_state(), step=4, epoch=0,
                     consumed_samples=16)
    return state


def saved(folder: Path, full: bool = True) -> Path:
    with warnings.catch_warnings():  # one process, no group: what no_dist=True says it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(user_state(full), checkpoint_id=str(folder), no_dist=True)
    return folder


def test_a_dcp_folder_is_read_by_its_metadata_and_names_each_piece(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every piece found where dcp.save put it (the saved dict rebuilt from planner_data),
    its small items read from the shard by weights_only: exact."""
    status, report, err = audit(saved(tmp_path / "ckpt"), capsys)
    r = rows(report)
    assert (status, report["kind"], report["verdict"]) == (
        EXIT_OK, "torch.distributed.checkpoint (DCP) folder", "exact resume possible"), err
    assert {k: (r[k]["status"], r[k]["where"]) for k in (
        "model", "optimizer", "optimizer step counts", "scheduler", "torch CPU RNG",
        "data position", "epoch", "global step")} == {
        "model": (PRESENT, "model"), "optimizer": (PRESENT, "optim"),
        "optimizer step counts": (PRESENT, "optim/state"), "scheduler": (PRESENT, "sched"),
        "torch CPU RNG": (PRESENT, "rng"), "data position": (PRESENT, "consumed_samples"),
        "epoch": (PRESENT, "epoch"), "global step": (PRESENT, "step")}
    assert r["optimizer step counts"]["detail"] == "4 of 4 parameters have 'step' (= 4)"
    assert r["scheduler"]["detail"] == "last_epoch 4"
    assert r["global step"]["detail"] == "step = 4"


def test_item_names_are_torchs_own_and_carry_no_metadata_type(tmp_path: Path) -> None:
    """The names, dtypes and shapes read without running the pickle equal what torch's own
    reader (pickle.load, on this trusted file) gives."""
    folder = saved(tmp_path / "ckpt")
    ours = item_names(read_metadata(folder / ".metadata"))
    theirs = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    assert set(ours) == set(theirs) and "model.0.weight" in ours
    for fqn, meta in theirs.items():
        if isinstance(meta, dcp.metadata.TensorStorageMetadata):
            assert (ours[fqn].dtype, ours[fqn].shape) == (
                str(meta.properties.dtype).removeprefix("torch."), tuple(meta.size)), fqn
        else:
            assert ours[fqn] is None, fqn


def test_model_and_optimizer_alone_are_impossible_naming_what_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, report, _ = audit(saved(tmp_path / "ckpt", full=False), capsys)
    assert (status, report["verdict"]) == (
        EXIT_FAILED, "exact resume impossible: scheduler, torch CPU RNG, data position, "
                     "epoch, global step missing")


def test_a_lone_shard_is_a_dcp_shard_and_no_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """__0_0.distcp alone is named a DCP shard (its items are found by .metadata), exit 1,
    never "truncated or damaged"."""
    folder = saved(tmp_path / "ckpt")
    (tmp_path / "elsewhere").mkdir()
    lone = shutil.copy(folder / "__0_0.distcp", tmp_path / "elsewhere")
    for path, beside in ((folder / "__0_0.distcp", f"({folder})"),
                         (Path(lone), "(none beside it: no .metadata)")):
        status, report, err = audit(path, capsys)
        assert (status, report["kind"]) == (
            EXIT_FAILED, "torch.distributed.checkpoint (DCP) shard file"), err
        assert report["refused"].startswith("rank 0's shard file of a DCP checkpoint")
        assert report["refused"].endswith(beside)


def test_a_folder_without_its_metadata_is_a_half_written_save(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dcp.save writes .metadata last: shards without it are a save that did not finish;
    a .metadata naming a shard that is gone cannot be loaded either."""
    folder = saved(tmp_path / "ckpt")
    shutil.copytree(folder, tmp_path / "gone")
    (folder / ".metadata").unlink()
    status, report, _ = audit(folder, capsys)
    assert (status, report["kind"]) == (
        EXIT_FAILED, "torch.distributed.checkpoint (DCP) folder, half-written")
    assert "a crash mid-save" in report["refused"] and "__0_0.distcp" in report["refused"]
    (tmp_path / "gone" / "__0_0.distcp").unlink()
    status, report, _ = audit(tmp_path / "gone", capsys)
    assert status == EXIT_FAILED
    assert report["refused"].startswith("shard file(s) __0_0.distcp named by .metadata are "
                                        "missing")
    assert report["rows"] == []  # every item's value lived in the shard


def test_a_payload_in_metadata_does_not_run(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A .metadata naming os.system (what torch's own pickle.load would call) is refused
    with one line, exit 2, and the command it carries never runs."""
    folder = saved(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    payload = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    (folder / ".metadata").write_bytes(payload)
    status, report, err = audit(folder, capsys)
    assert (status, report) == (EXIT_USAGE, {})
    assert "not a DCP .metadata that can be read safely" in err and "os.system" in err
    assert not marker.exists()
    pickle.loads(payload)  # the same bytes through pickle, as torch's reader
    assert marker.exists()  # does: the payload is live, so the check above can fail)
