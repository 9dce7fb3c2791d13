"""`python -m parity audit` on a Hugging Face Trainer checkpoint-<step>/ folder written here by
hand, file by file as transformers' Trainer._save_checkpoint writes them (no transformers
needed), on a .safetensors file alone and on an optimizer's state_dict alone; and `--json`
through the real command line. tests/test_audit_hf_resume.py holds the verdicts to a real
Trainer's resume."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab.audit_pickle import read_inert
from parity.lab.audit_recognize import INCOMPLETE, MISSING, NOT_NEEDED, PRESENT, UNSAFE
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE
from tests.test_audit import audit, rows, trained, write_safetensors

ROOT = Path(__file__).resolve().parents[1]
ARGS = {"fp16": False, "bf16": False, "ignore_data_skip": False, "seed": 0,
        "gradient_accumulation_steps": 1, "use_cpu": True, "output_dir": "out"}


def training_args_pickle(fields: dict[str, Any]) -> bytes:
    """A pickled TrainingArguments as Trainer's torch.save(args) holds it (a NEWOBJ of the
    dataclass, then BUILD with its __dict__), written opcode by opcode: the class is named,
    never imported."""
    body = pickle.dumps(fields, protocol=2)[2:-1]  # the dict's opcodes, no PROTO, no STOP
    return (b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81" + body
            + b"b.")  # EMPTY_TUPLE NEWOBJ <dict> BUILD STOP


def rng_states() -> dict[str, Any]:
    """What Trainer._save_rng_state saves on the CPU."""
    return {"python": random.getstate(),
            "numpy": np.random.get_state(),  # noqa: NPY002 (what Trainer saves)
            "cpu": torch.random.get_rng_state()}


def trainer_folder(folder: Path, *, step: int = 4, per_epoch: int = 6,
                   args: dict[str, Any] | None = None) -> Path:
    """checkpoint-<step>/ as Trainer writes it, of the model trained() builds."""
    t = trained()
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", t["model"])
    torch.save(t["optimizer"], folder / "optimizer.pt")
    torch.save(t["scheduler"], folder / "scheduler.pt")
    torch.save(rng_states(), folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": step, "epoch": step / per_epoch, "max_steps": 10, "log_history": [],
         "train_batch_size": 4}))
    (folder / "training_args.bin").write_bytes(training_args_pickle({**ARGS, **(args or {})}))
    (folder / "config.json").write_text("{}")
    return folder


def test_a_trainer_folder_names_each_piece_and_is_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every file is read as the piece it is (rng_state.pth's numpy state under the numpy
    allowlist, training_args.bin without running it), and trainer_state.json gives the step
    and the batches the resume skips: 10 steps at 6 a epoch is epoch 1, 4 steps in."""
    status, report, err = audit(trainer_folder(tmp_path / "checkpoint-10", step=10), capsys)
    r = rows(report)
    assert (status, report["kind"], report["verdict"]) == (
        EXIT_OK, "Hugging Face Trainer checkpoint", "exact resume possible"), err
    assert {k: (v["status"], v["where"]) for k, v in r.items()} == {
        "model": (PRESENT, "model.safetensors"), "optimizer": (PRESENT, "optimizer.pt"),
        "optimizer step counts": (PRESENT, "optimizer.pt/state"),
        "scheduler": (PRESENT, "scheduler.pt"), "scaler": (NOT_NEEDED, "training_args.bin"),
        "torch CPU RNG": (PRESENT, "rng_state.pth/cpu"),
        "CUDA RNG": (NOT_NEEDED, "training_args.bin"),
        "numpy RNG": (PRESENT, "rng_state.pth/numpy"),
        "Python random": (PRESENT, "rng_state.pth/python"),
        "data position": (PRESENT, "trainer_state.json (global_step, epoch)"),
        "epoch": (PRESENT, "trainer_state.json"),
        "global step": (PRESENT, "trainer_state.json")}
    assert r["global step"]["detail"] == "global_step = 10"
    assert r["epoch"]["detail"] == "1.667: epoch 1, 4 of its 6 update steps taken"
    assert r["data position"]["detail"] == "the resume skips the first 4 batches of epoch 1"
    assert any(f.startswith("training_args.bin: read without running it: fp16=False")
               for f in report["flags"])
    assert not any("legacy np.random" in f for f in report["flags"])


RNG = ("torch CPU RNG", "numpy RNG", "Python random")
CUTS = [("rng_state.pth", dict.fromkeys(RNG, MISSING), EXIT_FAILED),
        ("optimizer.pt", {"optimizer": MISSING, "optimizer step counts": MISSING,
                          "scheduler": INCOMPLETE}, EXIT_FAILED),
        ("scheduler.pt", {"scheduler": MISSING, "optimizer": INCOMPLETE}, EXIT_FAILED),
        ("trainer_state.json", dict.fromkeys(("data position", "epoch", "global step"),
                                             MISSING), EXIT_FAILED),
        ("model.safetensors", {"model": MISSING}, EXIT_FAILED),
        ("training_args.bin", {}, EXIT_UNKNOWN)]


@pytest.mark.parametrize(("cut", "changed", "exit_status"), CUTS, ids=[c for c, _, _ in CUTS])
def test_a_trainer_folder_missing_one_file_names_what_the_resume_loses(
        cut: str, changed: dict[str, str], exit_status: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each file left out changes exactly the rows it carries (Trainer loads optimizer.pt and
    scheduler.pt only together); without training_args.bin nothing required is missing, but
    the data skip cannot be verified: "unknown", never "exact"."""
    full = rows(audit(trainer_folder(tmp_path / "full"), capsys)[1])
    folder = trainer_folder(tmp_path / "cut")
    (folder / cut).unlink()
    status, report, _ = audit(folder, capsys)
    r = rows(report)
    assert status == exit_status and report["exact"] is False
    assert {k: v["status"] for k, v in r.items() if v["status"] != full[k]["status"]
            and k not in ("scaler", "CUDA RNG")} == changed
    if exit_status == EXIT_UNKNOWN:
        assert report["verdict"].startswith("unknown: training_args.bin missing")


def test_fp16_without_scaler_and_ignore_data_skip_are_not_exact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """training_args.bin decides: fp16=True makes scaler.pt required; ignore_data_skip=True
    means the resume trains the consumed batches again."""
    status, report, _ = audit(trainer_folder(tmp_path / "a", args={"fp16": True}), capsys)
    assert (status, rows(report)["scaler"]["status"], rows(report)["scaler"]["need"]) == (
        EXIT_FAILED, MISSING, "required")
    folder = trainer_folder(tmp_path / "b", args={"fp16": True})
    torch.save(trained()["scaler"], folder / "scaler.pt")
    assert audit(folder, capsys)[0] == EXIT_OK
    status, report, _ = audit(trainer_folder(tmp_path / "c", args={"ignore_data_skip": True}),
                              capsys)
    position = rows(report)["data position"]
    assert (status, position["status"]) == (EXIT_FAILED, MISSING)
    assert position["detail"].startswith("ignore_data_skip=True")


def test_one_rng_file_per_process_and_a_gap_among_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rng_state_<r>.pth, one a process: all there is exact; rank 1's missing is not."""
    folder = trainer_folder(tmp_path / "ranks")
    (folder / "rng_state.pth").unlink()
    for r in range(3):
        torch.save(rng_states(), folder / f"rng_state_{r}.pth")
    assert audit(folder, capsys)[0] == EXIT_OK
    (folder / "rng_state_1.pth").unlink()
    status, report, _ = audit(folder, capsys)
    cpu = rows(report)["torch CPU RNG"]
    assert (status, cpu["status"]) == (EXIT_FAILED, INCOMPLETE)
    assert "rng_state_1.pth missing" in cpu["detail"]


class Payload:
    """A pickle that would run a shell command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_payload_in_a_side_file_does_not_run_and_is_unreadable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rng_state.pth and training_args.bin holding a __reduce__ that calls os.system: the
    audit runs neither (the marker file is never made) and reports each unreadable."""
    marker = tmp_path / "ran"
    folder = trainer_folder(tmp_path / "evil")
    torch.save({**rng_states(), "cpu": Payload(marker)}, folder / "rng_state.pth")
    status, report, _ = audit(folder, capsys)
    assert not marker.exists()
    assert (status, rows(report)["torch CPU RNG"]["status"]) == (EXIT_FAILED, UNSAFE)
    assert any(f.startswith("rng_state.pth: unreadable") for f in report["flags"])
    folder = trainer_folder(tmp_path / "evil2")
    (folder / "training_args.bin").write_bytes(pickle.dumps(Payload(marker), protocol=2))
    status, report, _ = audit(folder, capsys)
    assert not marker.exists()
    assert status == EXIT_UNKNOWN and "training_args.bin unreadable" in report["verdict"]
    assert any(f.startswith("training_args.bin: unreadable") and "system" in f
               for f in report["flags"])
    with pytest.raises(pickle.UnpicklingError, match="system"):
        read_inert(pickle.dumps(Payload(marker)), ("transformers.",))
    pickle.loads(pickle.dumps(Payload(marker)))  # guard: the payload does run when unpickled
    assert marker.exists()


@pytest.mark.parametrize("extra", ["random_states_0.pkl", "global_step4"])
def test_a_folder_of_no_one_layout_is_refused(extra: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Trainer's files beside Accelerate's: unknown layout; a DeepSpeed step folder: not
    supported. Never a guess: exit 2, one line."""
    folder = trainer_folder(tmp_path / "mixed")
    (folder / extra).mkdir() if extra.startswith("global") else (folder / extra).write_bytes(b"")
    status, report, err = audit(folder, capsys)
    assert status == EXIT_USAGE and report == {} and len(err.strip().splitlines()) == 1
    assert ("unknown layout" if extra.endswith(".pkl") else "DeepSpeed") in err


def test_a_lone_safetensors_file_is_weights_only(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    t = trained()
    write_safetensors(tmp_path / "model.safetensors", t["model"])
    status, report, _ = audit(tmp_path / "model.safetensors", capsys)
    r = rows(report)
    assert (status, report["kind"]) == (EXIT_FAILED, "safetensors file: weights only")
    values = sum(v.numel() for v in t["model"].values())
    assert (r["model"]["status"], r["model"]["detail"]) == (
        PRESENT, f"{len(t['model'])} tensors, {values:,} values")
    assert {k for k, v in r.items() if v["status"] == MISSING} >= {
        "optimizer", "scheduler", "torch CPU RNG", "data position", "global step"}
    assert any(f.startswith("weights only") for f in report["flags"])


def test_a_lone_optimizer_state_is_an_optimizer_not_a_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """optimizer.pt alone: the moments per parameter and the step, and no model (the
    per-parameter exp_avg tensors are not weights)."""
    torch.save(trained()["optimizer"], tmp_path / "optimizer.pt")
    status, report, _ = audit(tmp_path / "optimizer.pt", capsys)
    r = rows(report)
    assert (status, report["kind"]) == (EXIT_FAILED,
                                        "optimizer state (a torch.optim state_dict alone)")
    assert (r["model"]["status"], r["optimizer"]["status"]) == (MISSING, PRESENT)
    assert any(f.startswith("an optimizer's state alone, not a model: exp_avg, exp_avg_sq "
                            "for 4 parameter(s), step 2") for f in report["flags"])


def test_json_on_the_real_command_line_is_one_object(tmp_path: Path) -> None:
    """`python -m parity audit DIR --json` as a user runs it: stdout is json.load-able, the
    verdict inside it, and nothing on stderr."""
    folder = trainer_folder(tmp_path / "checkpoint-4")
    shutil.copy(folder / "optimizer.pt", tmp_path / "optimizer.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for target, code in ((folder, EXIT_OK), (tmp_path / "optimizer.pt", EXIT_FAILED)):
        done = subprocess.run([sys.executable, "-m", "parity", "audit", str(target), "--json"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        report = json.loads(done.stdout)
        assert (done.returncode, done.stderr) == (code, "")
        assert report["verdict"].startswith("exact resume p" if code == EXIT_OK
                                            else "exact resume impossible")
