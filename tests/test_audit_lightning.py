"""`python -m parity audit` on Lightning `.ckpt` files written here by torch.save with the keys
and loop counters lightning 2.6.6's Trainer writes (copied from the real files of
tests/test_audit_lightning_resume.py's runs: 6 batches an epoch, checkpoints after batch 4,
at the end of epoch 0, after the last batch of epoch 1), no lightning needed. The slow test
holds each verdict to Lightning's own resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from parity.lab.audit_lightning import FIX, MEASURED
from parity.lab.audit_recognize import MISSING, PRESENT
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN
from tests.test_audit import audit, rows, trained


def progress(n: int, done: int | None = None) -> dict[str, int]:
    """Lightning's _ReadyCompletedTracker dict: n ready, started and processed, `done`
    completed (n unless said)."""
    return {"ready": n, "started": n, "processed": n, "completed": n if done is None else done}


def fit_loop(stage: str, loader: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """loops/fit_loop of a real checkpoint saved at `stage`: "mid-epoch" (after batch 4 of
    epoch 0), "epoch end" (epoch 0's on_train_epoch_end), "last batch" (after batch 6 of
    epoch 1, in on_train_batch_end)."""
    epoch, batches, last = {
        "mid-epoch": ({**progress(1, 0), "processed": 0}, (4, 4, 3), False),
        "epoch end": (progress(1, 0), (6, 6, 6), True),
        "last batch": ({**progress(2, 1), "processed": 1}, (12, 6, 5), True),
    }[stage]
    total, current, done = batches
    return {"state_dict": {} if loader is None else {"combined_loader": loader},
            "epoch_loop.state_dict": {"_batches_that_stepped": done},
            "epoch_loop.batch_progress": {"total": progress(total, total - (current > done)),
                                          "current": progress(current, done),
                                          "is_last_batch": last},
            "epoch_progress": {"total": epoch, "current": epoch}}


def lightning_ckpt(stage: str, rng: bool = True, loader: list[dict[str, Any]] | None = None,
                   generator: bool = True) -> dict[str, Any]:
    """A .ckpt of a LightningModule with the RNG hooks of parity/lab/audit_lightning.py
    (`rng`), and the DataLoader's generator saved by a Callback (`generator`: the
    LoaderGenerator of tests/test_audit_lightning_resume.py, under "callbacks")."""
    t = trained()
    callbacks = ({"LoaderGenerator": {"generator": torch.Generator().manual_seed(7).get_state()}}
                 if generator else {})
    state = {"epoch": 0 if stage != "last batch" else 1, "global_step": 4,
             "pytorch-lightning_version": "2.6.6",
             "state_dict": {f"net.{k}": v for k, v in t["model"].items()},
             "loops": {"fit_loop": fit_loop(stage, loader)}, "callbacks": callbacks,
             "optimizer_states": [t["optimizer"]], "lr_schedulers": [t["scheduler"]]}
    return {**state, "torch_rng_state": torch.get_rng_state()} if rng else state


def run_audit(tmp_path: Path, state: dict[str, Any], capsys: pytest.CaptureFixture[str]
              ) -> tuple[int, dict[str, Any]]:
    torch.save(state, tmp_path / "epoch=0-step=4.ckpt")
    status, report, err = audit(tmp_path / "epoch=0-step=4.ckpt", capsys)
    assert report["kind"] == "Lightning checkpoint", err
    return status, report


@pytest.mark.parametrize("stage", ["epoch end", "last batch"])
def test_a_lightning_checkpoint_at_an_epoch_boundary_with_its_generators_is_exact(
        stage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At an epoch's end (or after its last batch) the next epoch's order is drawn from the
    DataLoader's generator: with the torch CPU generator's state (the hook's) and one besides
    (a Callback's), exact, as Lightning's resume measured (0)."""
    status, report = run_audit(tmp_path, lightning_ckpt(stage), capsys)
    r = rows(report)
    assert (status, report["verdict"]) == (EXIT_OK, "exact resume possible")
    assert (r["data position"]["status"], r["data position"]["where"]) == (
        PRESENT, "loops/fit_loop/epoch_progress")
    assert "2 generator states (callbacks/LoaderGenerator/generator, torch_rng_state)" in \
        r["data position"]["detail"]
    cost = MEASURED["boundary registered generator"]
    assert cost == (0.0, 0) and f"max |Δw| {cost[0]:g})" in r["data position"]["detail"]


@pytest.mark.parametrize(("stage", "rng", "generator", "twice"), [
    ("epoch end", True, False, False), ("last batch", True, False, False),
    ("epoch end", False, True, False), ("epoch end", True, False, True)])
def test_an_epoch_boundary_with_one_generator_state_is_unknown(
        stage: str, rng: bool, generator: bool, twice: bool, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """One generator state (the hook's torch CPU RNG alone, a Callback's alone, or the torch
    CPU RNG saved twice): exact if the DataLoader has no generator= of its own (measured 0),
    not with one, which Lightning does not reseed and no key holds: unknown (exit 5) with
    both measurements and the fix, never exact."""
    state = lightning_ckpt(stage, rng=rng, generator=generator)
    if twice:
        state["callbacks"] = {"RNG": {"torch": state["torch_rng_state"].clone()}}
    status, report = run_audit(tmp_path, state, capsys)
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert rows(report)["data position"]["status"] == PRESENT
    text = report["unknown"]
    for key in ("boundary generator", "last batch generator"):
        assert f"{MEASURED[key][0]:g}, {MEASURED[key][1]} " in text
    assert f"(measured: max |Δw| {MEASURED['boundary'][0]:g})" in text
    assert text.endswith(f"Fix: {FIX}")


def test_a_16_mixed_lightning_checkpoint_names_where_each_piece_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """16-mixed: the precision plugin's GradScaler state is required and found."""
    state = {**lightning_ckpt("epoch end"), "MixedPrecision": trained()["scaler"],
             "hyper_parameters": {"precision": "16-mixed"}}
    status, report = run_audit(tmp_path, state, capsys)
    r = rows(report)
    assert status == EXIT_OK
    assert {i: (r[i]["status"], r[i]["where"]) for i in ("model", "optimizer", "scheduler",
                                                          "scaler", "global step")} == {
        "model": (PRESENT, "state_dict"), "optimizer": (PRESENT, "optimizer_states/0"),
        "scheduler": (PRESENT, "lr_schedulers/0"), "scaler": (PRESENT, "MixedPrecision"),
        "global step": (PRESENT, "global_step")}
    del state["MixedPrecision"]
    assert run_audit(tmp_path, state, capsys)[1]["verdict"] == \
        "exact resume impossible: scaler missing"


def test_a_lightning_checkpoint_without_its_rng_is_impossible(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, report = run_audit(tmp_path, lightning_ckpt("epoch end", rng=False,
                                                        generator=False), capsys)
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: torch CPU RNG missing")


def test_mid_epoch_with_a_plain_dataloader_is_unknown_never_possible(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's loop counters say batch 4, but no loader state is saved: a plain
    DataLoader restarts its epoch, so the verdict is unknown (exit 5), naming the fix and
    the measured cost; the data position row is not taken from the counters."""
    status, report = run_audit(tmp_path, lightning_ckpt("mid-epoch"), capsys)
    row = rows(report)["data position"]
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert (row["status"], row["where"]) == (MISSING, "loops/fit_loop")
    assert row["need"] != "required" and "4 batches into epoch 0" in row["detail"]
    text = report["unknown"]
    assert report["verdict"] == f"unknown: {text}"
    assert "plain DataLoader restarts its epoch" in text and "every_n_epochs=1" in text
    assert f"max |Δw| {MEASURED['plain'][0]:g}" in text


@pytest.mark.parametrize(("stage", "key"), [("mid-epoch", "stateful"),
                                             ("epoch end", "stateful boundary")])
def test_a_stateful_loaders_checkpoint_is_unknown_even_at_an_epoch_boundary(
        stage: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A StatefulDataLoader's state saved (fit_loop's combined_loader): the position is
    there, but the restored loader draws from the torch CPU generator otherwise than the
    straight run: unknown (exit 5), mid-epoch and at an epoch's end alike, with the cost
    Lightning's resume measured."""
    loader = [{"_num_yielded": 4, "_sampler_iter_yielded": 4}]
    status, report = run_audit(tmp_path, lightning_ckpt(stage, loader=loader), capsys)
    row = rows(report)["data position"]
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert (row["status"], row["where"]) == (PRESENT,
                                             "loops/fit_loop/state_dict/combined_loader")
    assert f"max |Δw| {MEASURED[key][0]:g}, {MEASURED[key][1]} tensors" in report["unknown"]


def test_the_page_prints_the_measured_epoch_end_resumes() -> None:
    """docs/your-trainer.md's Lightning table holds MEASURED's epoch-end resumes (the slow
    test measures them again) beside the verdicts the audit gives those files."""
    page = (Path(__file__).parents[1] / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    own, last = MEASURED["boundary generator"], MEASURED["last batch generator"]
    assert (f"| the same two, the loop with `DataLoader(shuffle=True, generator=g)` | unknown: "
            f"the DataLoader's generator (5) | {own[0]:g} ({own[1]}); {last[0]:g} ({last[1]}) |"
            ) in page
    assert ("| the same two, `g` saved by the `LoaderGenerator` Callback | exact resume "
            "possible (0) | **0**; **0** |") in page
    assert MEASURED["boundary"] == MEASURED["boundary registered generator"] == (0.0, 0)
