"""`python -m parity audit` on Accelerate `save_state` folders written here file by file as
accelerate 1.x writes them (the names of tests/test_audit_accelerate_resume.py's real
folders: model.safetensors, optimizer.bin, scheduler.bin, random_states_0.pkl a torch.save
dict, custom_checkpoint_0.pkl the registered object's state_dict), no accelerate needed.
The slow test holds each verdict to Accelerate's own load_state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab.audit_accelerate import MEASURED
from parity.lab.audit_recognize import MISSING, PRESENT, UNSAFE
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


def test_saved_at_an_epochs_end_with_the_step_registered_is_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every piece where load_state finds it; random_states_0.pkl read with numpy's array
    globals allowed (nothing run); the step and position from the registered state."""
    folder = save_state(tmp_path / "epoch_0", {"global_step": 6, "epoch": 1,
                                                "step_in_epoch": 0})
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
        "data position": (PRESENT, "custom_checkpoint_0.pkl/step_in_epoch"),
        "epoch": (PRESENT, "custom_checkpoint_0.pkl/epoch"),
        "global step": (PRESENT, "custom_checkpoint_0.pkl/global_step")}
    assert r["global step"]["detail"] == "6 (registered for checkpointing)"
    assert f"max |Δw| {MEASURED['boundary'][0]:g}" in r["data position"]["detail"]


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


def test_a_stateful_loaders_state_is_unknown_and_a_refused_rng_file_unsafe(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dl_state_dict.bin (use_stateful_dataloader) is found but not held to a resume:
    unknown; a random_states pickle weights_only refuses leaves its RNG rows unsafe."""
    state = {"global_step": 4, "epoch": 0, "step_in_epoch": 4}
    folder = save_state(tmp_path / "a", state, extra={"dl_state_dict.bin": {
        "_num_yielded": 4, "_sampler_iter_yielded": 4}})
    status, report, _ = audit(folder, capsys)
    assert status == EXIT_UNKNOWN and "dl_state_dict.bin" in report["unknown"]
    assert rows(report)["data position"]["where"] == "dl_state_dict.bin"
    folder = save_state(tmp_path / "b", state)
    torch.save({"step": 0, "torch_manual_seed": torch.get_rng_state(),
                "bad": np.random.default_rng(0)}, folder / "random_states_0.pkl")
    status, report, _ = audit(folder, capsys)
    assert status == EXIT_FAILED
    assert rows(report)["torch CPU RNG"]["status"] == UNSAFE
