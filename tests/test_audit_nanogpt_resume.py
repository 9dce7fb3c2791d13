"""The audit's verdict on a nanoGPT train.py checkpoint held to train.py's own resume:
examples/nanogpt_train.py (nanoGPT's loop and checkpoint, cut down) run straight for 8
iterations, and again for 4 then `--init_from=resume` to 8, in float16 on the CPU (the
GradScaler disabled by train.py's own rule: it warns that CUDA is not available) with each
way of saving the RNG (none, taken on the line that saves, taken before the prefetch), and
in bfloat16; the weights of each run's checkpoint at iteration 8 against the straight run's
(max |Δw|, tensors differing), the iteration-4 checkpoint audited with `audit --json`. The
numbers are parity/lab/audit_nanogpt.MEASURED, which the audit prints: asserted here. And
`resume-check --script` on the same script, whose verdict train.py's config decides.

Cost: 14 runs of the script, each a fresh interpreter importing torch (about 2 s): slow
(measured 32 s in all on a busy 2-core machine); tests/test_audit_nanogpt.py checks the
verdicts by default on the layout these runs write (asserted the same here).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from parity.lab.audit_nanogpt import FIX, MEASURED
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN, main
from tests.test_audit import audit, rows
from tests.test_audit_nanogpt import SCRIPT, train_py_checkpoint

pytestmark = pytest.mark.slow  # the reason: the module docstring's Cost

N, HALF = 8, 4  # the script's eval_interval is 4: checkpoints at 4 and 8
DISABLED = "GradScaler is enabled, but CUDA is not available.  Disabling."


def run(folder: Path, max_iters: int, *flags: str) -> str:
    """The script run as nanoGPT's train.py is, in `folder`; its stderr."""
    folder.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, str(SCRIPT), "--out_dir=out",
                           f"--max_iters={max_iters}", *flags], cwd=folder,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "out" / "ckpt.pt", weights_only=True)["model"]


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(max |Δw| to 3 significant digits, tensors differing)."""
    d = [float((a[k] - b[k]).abs().max()) for k in a]
    return float(f"{max(d):.3g}"), sum(x != 0 for x in d)


def halted_and_resumed(tmp_path: Path, name: str, *flags: str) -> tuple[Path, Path]:
    """The folder trained to HALF, resumed to N; a copy of the HALF checkpoint to audit."""
    folder = tmp_path / name
    run(folder, HALF, *flags)
    half = tmp_path / f"{name}-ckpt{HALF}.pt"
    shutil.copyfile(folder / "out" / "ckpt.pt", half)
    run(folder, N, *flags, "--init_from=resume")
    return folder, half


def same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Top keys, model_args' and config's keys, and their value types alike."""
    def shape(c: dict[str, Any]) -> Any:
        return ({k: type(v) for k, v in c.items() if k not in ("model", "optimizer")},
                {k: type(v) for k, v in c["model_args"].items()},
                {k: type(v) for k, v in c["config"].items()})
    return shape(a) == shape(b)


def test_train_py_resumes_are_what_the_audit_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """float16 on the CPU: without the RNG the resume differs by MEASURED["no"] and the
    audit says impossible naming the torch CPU RNG, with the fix; with it taken on the line
    that saves, MEASURED["at_save"]; before the prefetch, exact; both unknown (exit 5), never
    impossible, and the half runs' weights are the same whatever is saved."""
    stderr = run(tmp_path / "straight", N)
    assert (DISABLED in stderr) == (not torch.cuda.is_available())
    straight = weights(tmp_path / "straight")
    halves = []
    for save_rng, status in (("no", EXIT_FAILED), ("at_save", EXIT_UNKNOWN),
                             ("before_batch", EXIT_UNKNOWN)):
        folder, half = halted_and_resumed(tmp_path, save_rng, f"--save_rng={save_rng}")
        assert difference(weights(folder), straight) == MEASURED[save_rng], save_rng
        got, report, _ = audit(half, capsys)
        assert (got, report["exact"]) == (status, False), save_rng
        r = rows(report)
        assert (r["scheduler"]["status"], r["scaler"]["status"]) == ("not needed",) * 2
        if save_rng == "no":
            assert report["verdict"] == ("exact resume impossible: torch CPU RNG, data "
                                         "position, epoch missing")
            assert any(f.endswith(f"Fix: {FIX}") for f in report["flags"])
        else:
            assert report["unknown"].endswith(f"Fix: {FIX}")
        loaded = torch.load(half, weights_only=True)
        assert same_layout(loaded, train_py_checkpoint(save_rng != "no"))
        halves.append(loaded["model"])
    assert difference(halves[0], halves[1]) == difference(halves[0], halves[2]) == (0.0, 0)
    assert MEASURED["before_batch"] == (0.0, 0) and MEASURED["no"][0] > 0
    assert MEASURED["at_save"][0] > 0


def test_bfloat16_on_the_cpu_trains_as_float16_and_resumes_exactly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the CPU train.py autocasts nothing and its scaler is off either way (bfloat16:
    enabled=False, no warning): the same weights as float16's run; resumed with the RNG
    taken before the prefetch, exact; audited unknown, the scaler not needed (not fp16)."""
    assert DISABLED not in run(tmp_path / "straight", N, "--dtype=bfloat16")
    run(tmp_path / "float16", N)
    straight = weights(tmp_path / "straight")
    assert difference(weights(tmp_path / "float16"), straight) == (0.0, 0)
    folder, half = halted_and_resumed(tmp_path, "resumed", "--dtype=bfloat16",
                                      "--save_rng=before_batch")
    assert difference(weights(folder), straight) == (0.0, 0)
    got, report, _ = audit(half, capsys)
    assert (got, report["exact"]) == (EXIT_UNKNOWN, False)
    assert (rows(report)["scaler"]["status"], rows(report)["scaler"]["need"]) == \
        ("not needed", "if trained in fp16")


def test_resume_check_on_train_py_names_only_its_config_strings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`resume-check --script` on the script saving the RNG before the prefetch: every
    weight and optimizer entry equal, yet "differs", at the two strings train.py's config
    records from its own command line (out_dir, the {dir} of each run, and init_from);
    with those two named by --ignore, exact."""
    monkeypatch.chdir(tmp_path)
    command = (f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))} --out_dir={{dir}} "
               "--max_iters={steps} --save_rng=before_batch")
    assert main(["resume-check", "--script", command, "--resume-flag=--init_from=resume",
                 "--steps", str(N), "--at", str(HALF), "--json"]) == EXIT_FAILED
    body, _, last = capsys.readouterr().out.rstrip("\n").rpartition("\n")
    assert last == "resume-check: differs: first entry config.out_dir"
    assert [d["entry"] for d in json.loads(body)["final"]] == ["config.out_dir",
                                                                "config.init_from"]
    assert main(["resume-check", "--script", command, "--resume-flag=--init_from=resume",
                 "--ignore", "config.out_dir", "--ignore", "config.init_from",
                 "--steps", str(N), "--at", str(HALF)]) == EXIT_OK  # the two named apart
    assert capsys.readouterr().out.splitlines()[-1] == "resume-check: exact"
