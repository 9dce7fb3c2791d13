"""`python -m parity audit` on Accelerate `save_state` folders written here file by file as
accelerate 1.x writes them (the names of tests/test_audit_accelerate_resume.py's real
folders: model.safetensors, optimizer.bin, scheduler.bin, random_states_0.pkl a torch.save
dict, custom_checkpoint_0.pkl the registered object's state_dict, dl_state_dict.bin a
StatefulDataLoader's state_dict), no accelerate or torchdata needed. The slow test holds
each verdict to Accelerate's own load_state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab.audit_accelerate import GENERATOR_FIX, LOADERS, MEASURED, STATEFUL_FIX
from parity.lab.audit_recognize import INCOMPLETE, MISSING, PRESENT, UNSAFE
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN
from tests.test_audit import audit, rows, trained, write_safetensors


def save_state(folder: Path, registered: dict[str, int] | None, counter: int = 0,
               extra: dict[str, Any] | None = None) -> Path:
    """Accelerate's save_state folder of the model trained() builds; `counter` the
    Accelerator.step it pickles as "step"; `registered` the registered object's state."""
    t = trained()
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", t["model"])
    torch.save(t["optimizer"], folder / "optimizer.bin")
    torch.save(t["scheduler"], folder / "scheduler.bin")
    torch.save({"step": counter, "random_state": random.getstate(),
                "numpy_random_seed": np.random.get_state(),  # noqa: NPY002 (Accelerate's)
                "torch_manual_seed": torch.get_rng_state()}, folder / "random_states_0.pkl")
    if registered is not None:
        torch.save(registered, folder / "custom_checkpoint_0.pkl")
    for name, value in (extra or {}).items():
        torch.save(value, folder / name)
    return folder


EPOCH_END = {"global_step": 6, "epoch": 1, "step_in_epoch": 0}


def test_saved_at_an_epochs_end_with_its_generator_registered_is_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every piece where load_state finds it; random_states_0.pkl read with numpy's array
    globals allowed (nothing run); the step and position from the registered state, and the
    DataLoader's generator registered (custom_checkpoint_1.pkl, a state other than the torch
    CPU generator's, which stays random_states_0.pkl's): exact, as measured."""
    generator = {"generator": torch.Generator().manual_seed(7).get_state()}
    folder = save_state(tmp_path / "epoch_0", EPOCH_END,
                        extra={"custom_checkpoint_1.pkl": generator})
    status, report, err = audit(folder, capsys)
    r = rows(report)
    assert (status, report["kind"], report["verdict"]) == (
        EXIT_OK, "Accelerate save_state folder", "exact resume possible"), err
    assert {k: (v["status"], v["where"]) for k, v in r.items() if k not in (
        "scaler", "CUDA RNG", "optimizer step counts")} == {
        "model": (PRESENT, "model.safetensors"), "optimizer": (PRESENT, "optimizer.bin"),
        "scheduler": (PRESENT, "scheduler.bin"),
        "torch CPU RNG": (PRESENT, "random_states_0.pkl/torch_manual_seed"),
        "numpy RNG": (PRESENT, "random_states_0.pkl/numpy_random_seed"),
        "Python random": (PRESENT, "random_states_0.pkl/random_state"),
        "data position": (PRESENT, "custom_checkpoint_0.pkl/step_in_epoch, "
                                   "custom_checkpoint_1.pkl/generator"),
        "epoch": (PRESENT, "custom_checkpoint_0.pkl/epoch"),
        "global step": (PRESENT, "custom_checkpoint_0.pkl/global_step")}
    assert r["global step"]["detail"] == "6 (registered for checkpointing)"
    cost = MEASURED["boundary registered generator"]
    assert cost == (0.0, 0)
    assert f"(measured, registered: max |Δw| {cost[0]:g})" in r["data position"]["detail"]


@pytest.mark.parametrize("registered", [None, "torch CPU generator's copy"])
def test_saved_at_an_epochs_end_is_unknown_for_the_dataloaders_generator_is_unseen(
        registered: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At an epoch's end with no generator of the loop's own registered (none, or only a copy
    of the torch CPU generator's state, which random_states_0.pkl holds already): exact
    without a DataLoader generator= (measured 0), not with one, which no file holds: unknown
    (exit 5), both measurements and the fix named, never exact."""
    folder = save_state(tmp_path / "epoch_0", EPOCH_END)
    if registered:
        saved = torch.load(folder / "random_states_0.pkl", weights_only=False)
        torch.save({"rng": saved["torch_manual_seed"]}, folder / "custom_checkpoint_1.pkl")
    status, report, _ = audit(folder, capsys)
    r = rows(report)
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert (r["data position"]["status"], r["data position"]["where"]) == (
        PRESENT, "custom_checkpoint_0.pkl/step_in_epoch")
    assert r["torch CPU RNG"]["status"] == PRESENT
    boundary, own = MEASURED["boundary"], MEASURED["boundary generator"]
    assert f"(measured: max |Δw| {boundary[0]:g})" in report["unknown"]
    assert f"measured: max |Δw| {own[0]:g}, {own[1]} tensors differing" in report["unknown"]
    assert report["unknown"].endswith(f"Fix: {GENERATOR_FIX}")


def test_the_pickled_step_is_the_accumulation_counter_not_the_global_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """random_states_0.pkl's "step" (3 here: Accelerator.step, mid-accumulation) is never
    read as the global step: with nothing registered, global step and epoch are missing and
    the row says what the pickled step is."""
    folder = save_state(tmp_path / "checkpoint", None, counter=3)
    status, report, _ = audit(folder, capsys)
    row = rows(report)["global step"]
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: epoch, global step missing")
    assert (row["status"], row["where"]) == (MISSING, "")
    assert row["detail"].startswith("random_states_0.pkl's 'step' = 3 is Accelerate's "
                                    "gradient-accumulation counter (Accelerator.step)")


def test_saved_mid_epoch_is_unknown_with_the_measured_cost(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """4 batches into the epoch: the resumed loop's skip_first_batches starts a new
    shuffled pass, so the verdict is unknown (exit 5), naming the cost and the fix."""
    folder = save_state(tmp_path / "step_4", {"global_step": 4, "epoch": 0,
                                              "step_in_epoch": 4})
    status, report, _ = audit(folder, capsys)
    row = rows(report)["data position"]
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert (row["status"], row["detail"]) == (
        MISSING, "4 batches into the epoch (custom_checkpoint_0.pkl/step_in_epoch)")
    cost = MEASURED["mid-epoch"]
    assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors differing" in report["unknown"]
    assert "register_for_checkpointing" in report["unknown"]


@pytest.mark.parametrize(("name", "step", "epoch", "status"), [
    ("step_6", PRESENT, MISSING, EXIT_UNKNOWN), ("epoch_0", MISSING, PRESENT, EXIT_FAILED)])
def test_the_folders_name_is_read_as_accelerates_examples_name_it(
        name: str, step: str, epoch: str, status: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """step_<n> gives the global step (where in the epoch stays unseen: unknown); epoch_<n>
    an epoch's end, but no step: impossible."""
    got, report, _ = audit(save_state(tmp_path / name, None), capsys)
    r = rows(report)
    assert (got, r["global step"]["status"], r["epoch"]["status"]) == (status, step, epoch)
    assert "the folder's name" in (r["global step"]["where"], r["epoch"]["where"])


def loader_state(batches: int, end: bool, sampler: bool) -> dict[str, Any]:
    """A one-process StatefulDataLoader's state_dict() as Accelerate saves it (torchdata 0.11,
    the keys of tests/test_audit_accelerate_resume.py's folders), `batches` of 4 samples
    yielded; `sampler`: torchdata's RandomSampler (its generator's state at the epoch's
    start), else torch's (no state)."""
    iter_state = {"samples_yielded": 4 * batches, "sampler_iter_state": {
        "yielded": 4 * batches, "generator": torch.Generator().manual_seed(1).get_state()}}
    return {"_index_sampler_state": None, "_sampler_iter_state": iter_state if sampler else None,
            "_sampler_iter_yielded": batches, "_num_yielded": batches,
            "_IterableDataset_len_called": None, "_shared_seed": None, "fetcher_state": None,
            "dataset_state": None, "_iterator_finished": end}


PROGRESS = {"global_step": 4, "epoch": 0, "step_in_epoch": 4}


@pytest.mark.parametrize(("end", "where"), [(False, "mid-epoch"), (True, "boundary")])
def test_a_loader_state_without_a_sampler_state_is_impossible_with_the_fix(
        end: bool, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dl_state_dict.bin of DataLoader(shuffle=True) under use_stateful_dataloader: the batch
    count alone, no sampler state, so the resumed loader draws a new order (or draws once
    more at an epoch's end): data position incomplete (exit 1), measured, with the fix."""
    folder = save_state(tmp_path / "a", PROGRESS, extra={
        "dl_state_dict.bin": loader_state(6 if end else 4, end, sampler=False)})
    status, report, _ = audit(folder, capsys)
    row = rows(report)["data position"]
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: data position incomplete")
    assert (row["status"], row["where"]) == (INCOMPLETE, "dl_state_dict.bin")
    cost = MEASURED[f"stateless {where}"]
    assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors differing" in row["detail"]
    assert row["detail"].endswith(f"Fix: {STATEFUL_FIX}")
    assert ("at an epoch's end" if end else "4 batches into the epoch") in row["detail"]


@pytest.mark.parametrize(("end", "where"), [(False, "mid-epoch"), (True, "boundary")])
def test_a_sampler_state_is_unknown_for_the_dataloaders_generator_is_unseen(
        end: bool, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchdata's RandomSampler state restores the order, but the DataLoader's generator,
    which the resumed extra iterator draws from, is in no file: unknown (exit 5) with the
    three measured loaders (none, the sampler's, its own: exact), never exact; the torch CPU
    RNG is random_states_0.pkl's, never the sampler's generator in dl_state_dict.bin."""
    folder = save_state(tmp_path / "a", PROGRESS, extra={
        "dl_state_dict.bin": loader_state(6 if end else 4, end, sampler=True)})
    status, report, _ = audit(folder, capsys)
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    for loader in ("stateful", "shared generator", "own generator"):
        cost = MEASURED[f"{loader} {where}"]
        assert f"max |Δw| {cost[0]:g}" in report["unknown"]
    assert MEASURED[f"own generator {where}"] == (0.0, 0)
    assert report["unknown"].endswith(f"Fix: {STATEFUL_FIX}")
    r = rows(report)
    assert r["torch CPU RNG"]["where"] == "random_states_0.pkl/torch_manual_seed"
    (folder / "random_states_0.pkl").unlink()
    status, report, _ = audit(folder, capsys)
    row = rows(report)["torch CPU RNG"]
    cost = MEASURED[f"own generator {where} no rng"]
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: torch CPU RNG missing")
    assert (row["status"], row["where"]) == (MISSING, "")
    assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors differing" in row["detail"]


def test_a_loader_state_of_another_shape_is_unknown_and_a_refused_file_unsafe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A StatefulDataLoader state with worker processes (no _num_yielded at its top) and a
    seedable sampler's sampler.bin were never held to a resume: unknown; a dl_state_dict.bin
    weights_only refuses leaves the data position unsafe, and a random_states pickle it
    refuses the RNG rows: impossible."""
    folder = save_state(tmp_path / "s", PROGRESS, extra={"sampler.bin": {"epoch": 0}})
    status, report, _ = audit(folder, capsys)
    assert status == EXIT_UNKNOWN and report["unknown"].startswith("sampler.bin: a seedable")
    folder = save_state(tmp_path / "a", PROGRESS, extra={"dl_state_dict.bin": {
        "_snapshot": {}, "_steps_since_snapshot": 4, "_iterator_finished": False}})
    status, report, _ = audit(folder, capsys)
    assert status == EXIT_UNKNOWN and "worker processes" in report["unknown"]
    torch.save({"bad": np.random.default_rng(0)}, folder / "dl_state_dict.bin")
    status, report, _ = audit(folder, capsys)
    assert (status, rows(report)["data position"]["status"]) == (EXIT_FAILED, UNSAFE)
    folder = save_state(tmp_path / "b", PROGRESS)
    torch.save({"step": 0, "torch_manual_seed": torch.get_rng_state(),
                "bad": np.random.default_rng(0)}, folder / "random_states_0.pkl")
    status, report, _ = audit(folder, capsys)
    assert status == EXIT_FAILED
    assert rows(report)["torch CPU RNG"]["status"] == UNSAFE


def test_the_page_prints_the_measured_stateful_resumes() -> None:
    """docs/your-trainer.md's stateful-loader table holds MEASURED (the slow test measures it
    again): one row a loader, its four resumes in MEASURED's order."""
    page = (Path(__file__).parents[1] / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    table = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in page.splitlines() if line.startswith("| `") and "Loader" in line]
    cells = {row[0].strip("`"): row[2:] for row in table}
    number = {k: "**0**" if v == (0.0, 0) else f"{v[0]:g} ({v[1]})" for k, v in MEASURED.items()}
    assert cells == {text: [number[f"{k} {w}"] for w in ("mid-epoch", "boundary",
                                                         "mid-epoch no rng", "boundary no rng")]
                     for k, text in LOADERS.items()}


def test_the_page_prints_the_measured_epoch_end_resumes() -> None:
    """docs/your-trainer.md's save_state table holds MEASURED's epoch-end resumes (the slow
    test measures them again) beside the verdicts the audit gives those folders."""
    page = (Path(__file__).parents[1] / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    unknown, exact = "unknown: the DataLoader's generator (5)", "exact resume possible (0)"
    own = MEASURED["boundary generator"]
    for row in (f"| epoch_0/, Progress registered | {unknown} | **0** |",
                f"| epoch_0/, the same loop with `DataLoader(shuffle=True, generator=g)` | "
                f"{unknown} | {own[0]:g} ({own[1]}):",
                f"| epoch_0/, that loop with `GeneratorState(g)` registered | {exact} | **0** |"):
        assert row in page
    assert MEASURED["boundary"] == MEASURED["boundary registered generator"] == (0.0, 0)
