"""What the audit lists, entry by entry: every row of a checkpoint missing one required entry
(the first row, the model, too) names exactly that entry, in a torch.save dict and in this
project's own container; and torch.save's legacy (pre-zip) format is read as its zip is."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from common.train_loop import INVENTORY
from parity.lab.audit_recognize import ITEMS, PRESENT
from parity.lab.cli import EXIT_FAILED, EXIT_OK, main
from tests.test_audit import audit, complete, trained


def test_a_legacy_torch_save_file_is_read_as_the_zip_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch.save's legacy format (_use_new_zipfile_serialization=False) opens with a pickle
    PROTO too; its magic number says it is torch's: loaded with weights_only, it audits as
    the same state saved as a zip does (exact, every row present), not as a plain pickle."""
    state = complete(trained())
    torch.save(state, tmp_path / "zip.pt")
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert (tmp_path / "legacy.pt").read_bytes()[:2] == b"\x80\x02"  # guard: a pickle's PROTO
    zipped = audit(tmp_path / "zip.pt", capsys)[1]
    status, report, _ = audit(tmp_path / "legacy.pt", capsys)
    assert (status, report["exact"], report["refused"]) == (EXIT_OK, True, None), report
    assert report["kind"] == "torch.save dict"
    assert {r["status"] for r in report["rows"]} == {PRESENT}
    assert report["rows"] == zipped["rows"]


def one_place_each(t: dict[str, Any]) -> dict[str, Any]:
    """Each required entry under exactly one top-level key (fp16, so the scaler is required)."""
    return {"model": t["model"], "optimizer": t["optimizer"], "scheduler": t["scheduler"],
            "scaler": t["scaler"], "rng": {"torch": torch.get_rng_state()},
            "sampler": {"position": 16}, "epoch": 1, "global_step": 2,
            "config": {"dtype": "float16"}}


ONE_PLACE = [("model", ["model"]), ("optimizer", ["optimizer", "optimizer step counts"]),
             ("scheduler", ["scheduler"]), ("scaler", ["scaler"]), ("rng", ["torch CPU RNG"]),
             ("sampler", ["data position"]), ("epoch", ["epoch"]),
             ("global_step", ["global step"])]


@pytest.mark.parametrize(("key", "items"), ONE_PLACE, ids=[k for k, _ in ONE_PLACE])
def test_a_checkpoint_missing_one_entry_names_exactly_that_entry(
        key: str, items: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Every row is listed (the first, model, too): the rows that are required and not
    usable are exactly the entry left out, in the JSON and in the table's last line."""
    state = one_place_each(trained())
    torch.save(state, tmp_path / "full.pt")
    assert audit(tmp_path / "full.pt", capsys)[0] == EXIT_OK  # guard: complete without the cut
    del state[key]
    torch.save(state, tmp_path / "cut.pt")
    status, report, _ = audit(tmp_path / "cut.pt", capsys)
    assert [r["item"] for r in report["rows"]] == list(ITEMS)
    gaps = [r["item"] for r in report["rows"]
            if r["need"] == "required" and r["status"] != PRESENT]
    assert (status, gaps) == (EXIT_FAILED, items), report
    assert report["verdict"] == f"exact resume impossible: {', '.join(items)} missing"
    assert main(["audit", str(tmp_path / "cut.pt")]) == EXIT_FAILED
    assert capsys.readouterr().out.splitlines()[-1] == "audit: " + report["verdict"]


@pytest.fixture(scope="module")
def own_fp16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference single-process checkpoint of an fp16 run (its scaler required)."""
    run = tmp_path_factory.mktemp("own") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--impl", "reference", "--steps", "2", "--precision", "fp16",
                     "--checkpoint-dir", str(run), "--quiet"]) == EXIT_OK
    return run / "ckpt-00000002.ckpt"


# the project's inventory (common/train_loop.py) -> the audit's rows that then lack it
INVENTORY_ROWS = {"model": ["model"], "optimizer": ["optimizer", "optimizer step counts"],
                  "scheduler": ["scheduler"], "scaler": ["scaler"], "rng": ["numpy RNG"],
                  "data": ["data position"], "step": ["global step"]}


@pytest.mark.parametrize("entry", INVENTORY)
def test_the_projects_checkpoint_missing_an_inventory_entry_names_it(
        own_fp16: Path, entry: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The project's own container re-saved without one inventory entry: the inventory flag
    names exactly that entry, and the rows it fills are exactly the ones missing."""
    from reference import resume

    state = resume.load_checkpoint(own_fp16)
    del state[entry]
    resume.save_checkpoint(tmp_path / "ckpt-00000002.ckpt", state)
    status, report, _ = audit(tmp_path / "ckpt-00000002.ckpt", capsys)
    assert f"this project's inventory (common/train_loop.py): lacks {entry}" in report["flags"]
    gaps = [r["item"] for r in report["rows"]
            if r["need"] == "required" and r["status"] != PRESENT]
    assert (status, gaps) == (EXIT_FAILED, INVENTORY_ROWS[entry]), report
