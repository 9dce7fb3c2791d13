"""`python -m parity profile` through the real command line (parity.lab.cli.main, in process):
the prediction sheet is on disk, hashed as printed, before the model it predicts exists;
the folder holds the trace and the profile; bad input is one line and exit status 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import reference.train
import torch_impl.train
from parity.lab.cli import EXIT_OK, EXIT_USAGE, main

FAST = ["--steps", "4", "--wait", "1", "--warmup", "1", "--active", "2"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m parity profile ARGV`."""
    try:
        status = main(["profile", *argv])
    except SystemExit as e:  # argparse's own errors
        status = int(e.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(("impl", "model"), [
    ("reference", "mlp"), ("reference", "gpt"), ("torch", "mlp"),
    # the torch transformer's whole profile (2 s) is driven by parity/test_profile.py
    pytest.param("torch", "gpt", marks=pytest.mark.slow)])
def test_predictions_are_on_disk_and_hashed_before_the_model_exists(
        impl: str, model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    tree = torch_impl.train if impl == "torch" else reference.train
    built = []
    real_run = tree.Run

    def watched_run(*args: object, **kwargs: object) -> object:
        sheet = tmp_path / "predictions.json"
        built.append((sheet.exists(), (tmp_path / "predictions.md").exists(),
                      (tmp_path / "trace.json").exists()))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(tree, "Run", watched_run)
    status, out, err = _cli(capsys, "--impl", impl, "--model", model, "--out", str(tmp_path),
                            *FAST)
    assert status == EXIT_OK, err  # 0: no byte at any boundary differs from the formula
    assert built and all(b == (True, True, False) for b in built), built
    body = (tmp_path / "predictions.json").read_bytes()
    digest = hashlib.sha256(body).hexdigest()
    announce = next(line for line in out.splitlines() if line.startswith("predictions:"))
    assert digest in announce and out.index(announce) < out.index("## Time per phase")
    assert out.splitlines()[-1].endswith(f"predictions sha256 {digest}")
    sheet, result = json.loads(body), json.loads((tmp_path / "profile.json").read_text())
    assert sheet["written_ns"] < result["measured"]["measured_from_ns"]
    assert result["predictions"]["sha256"] == digest
    assert {k: sheet[k] for k in result["sheet"]} == result["sheet"]  # the sheet, unchanged
    for later in ("profile.json", "profile.md"):
        assert (tmp_path / later).stat().st_mtime_ns >= (tmp_path / "predictions.json").stat(
        ).st_mtime_ns


def test_torch_writes_a_chrome_trace_of_the_phases_that_a_rerun_does_not_leave_behind(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _cli(capsys, "--impl", "torch", "--out", str(tmp_path), *FAST)
    assert status == EXIT_OK, err
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"data wait", "host-to-device", "forward", "backward", "optimizer"} <= names
    md = (tmp_path / "profile.md").read_text()
    for heading in ("## Time per phase", "## Bytes at each phase boundary",
                    "## Honest timing", "saved tensors (measured"):
        assert heading in md
    assert "CPU: kernels run synchronously" in md  # the null on CPU, with its cause
    assert _cli(capsys, "--impl", "reference", "--out", str(tmp_path), *FAST)[0] == EXIT_OK
    assert not (tmp_path / "trace.json").exists()  # the reference writes no trace


def test_json_is_one_object_on_stdout(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _cli(capsys, "--impl", "reference", "--out", str(tmp_path), "--json",
                            *FAST)
    assert status == EXIT_OK, err
    result = json.loads(out)
    assert set(result) == {"predictions", "sheet", "measured", "comparison", "pictures"}
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert sorted(result["pictures"]) == drawn  # both, or none without matplotlib
    assert err.splitlines()[-1].startswith("profile: reference on CPU")


def _bad_cuda() -> str:
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


BAD = [
    (["--impl", "torch", "--device", "tpu"], "--device 'tpu': accepted: cpu, cuda, cuda:N"),
    (["--impl", "torch", "--steps", "5"], "--steps 5 is fewer than wait + warmup + active"),
    (["--impl", "torch", "--steps", "0"], "--steps: 0 is below the minimum 1"),
    (["--impl", "torch", "--model", "gpt", "--recompute", "selective"],
     "selective recomputation (the attention core) is not in the transformer's accountant"),
    (["--impl", "reference", "--model", "gpt", "--recompute", "uniform:9"],
     "accepted: none, sqrt, uniform:K, optimal:S"),
    (["--impl", "torch", "--model", "gpt", "--sizes", "8,4,3"], "--sizes: the MLP's shape"),
    (["--impl", "reference", "--device", "cuda"], "the reference runs in NumPy on the CPU"),
    (["--impl", "torch", "--recompute", "bogus"], "unknown schedule 'bogus'"),
    (["--impl", "torch", "--sizes", "8,32,1"], "2 to 16 classes"),
    (["--impl", "torch", "--threads", "0"], "--threads: 0 is below the minimum 1"),
    (["--impl", "reference", "--precision", "bf16", "--recompute", "sqrt"],
     "not composed in the reference"),
    (["--impl", "jax"], "invalid choice: 'jax'"),
]
if torch.cuda.is_available():
    BAD.append((["--impl", "torch", "--model", "gpt", "--device", "cuda", "--precision", "bf16"],
                "device 'cuda' with autocast"))
if not torch.cuda.is_available():
    BAD.append((["--impl", "torch", "--device", "cuda"], "torch.cuda.is_available() is False"))


@pytest.mark.parametrize(("argv", "phrase"), BAD, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(
        argv: list[str], phrase: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    status, out, err = _cli(capsys, *argv, "--out", str(out_dir))
    assert status == EXIT_USAGE
    assert phrase in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not out
    assert not out_dir.exists() or not any(out_dir.iterdir())
