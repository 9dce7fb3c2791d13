"""examples/my_trainer.py through every check of the project (parity/lab/my_trainer_checks.py):
each of its four bugs is found by the check meant for it, at its line, and nothing is found
in the --fixed version; the committed run that docs/your-trainer.md prints is this run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from parity.lab import my_trainer_checks as checks
from parity.lab.cli import main

SOURCE = checks.EXAMPLE.read_text(encoding="utf-8").splitlines()


def line_of(code: str) -> str:
    """examples/my_trainer.py:N of the one line holding `code` (read, not typed in)."""
    found = [i for i, text in enumerate(SOURCE, 1) if code in text]
    assert len(found) == 1, (code, found)
    return f"examples/my_trainer.py:{found[0]}"


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    return checks.run_all()


def test_the_scaler_guard_finds_the_clip_before_unscale_at_its_line(results) -> None:
    """Bug 1: exactly one finding, clip_before_unscale at the clip call; none when fixed."""
    found = results["scaler_guard"]
    assert len(found["buggy"]) == 1
    assert found["buggy"][0].startswith(
        f"{line_of('clip_grad_norm_(')}: error: clip_before_unscale:")
    assert found["fixed"] == []


def test_the_audit_finds_no_scaler_and_no_rng_in_the_checkpoint(results) -> None:
    """Bug 2, from the file alone: the scaler and torch's RNG state are missing and the file
    is flagged nanoGPT-style; the fixed checkpoint holds both."""
    found = results["audit"]
    assert found["buggy"]["rows"] == {"scaler": "missing", "torch CPU RNG": "missing"}
    assert "no scaler, torch CPU RNG" in found["buggy"]["text"]
    assert found["fixed"]["rows"] == {"scaler": "present", "torch CPU RNG": "present"}


def test_the_resume_check_names_the_rng_and_the_scaler_at_the_load(results) -> None:
    """Bug 2, from running the loop: the runs part right after the load, at torch's global
    generator and the scaler's growth tracker; the fixed loop resumes bit for bit."""
    found = results["resume_check"]
    assert not found["buggy"]["ok"] and found["buggy"]["parted_at"] == checks.AT
    assert found["buggy"]["parted"] == ["rng.torch", "trainer.scaler._growth_tracker"]
    assert found["fixed"]["ok"] and found["fixed"]["parted_at"] is None


def test_host_reads_find_the_item_in_every_step(results) -> None:
    """Bug 3: the loop's own code reads a float back to the host once per step, at the
    loss.item() line; the fixed loop reads none (GradScaler's own reads are torch's)."""
    found = results["host_reads"]
    assert found["buggy"] == {line_of("self.losses.append(loss.item())"): checks.GUARD_STEPS}
    assert found["fixed"] == {}


def test_the_numerics_detector_stops_at_the_hand_written_log_softmax(results) -> None:
    """Bug 4: the first invalid value is made in the forward, in the user's loss module, from
    logits above log(float16 max) = 11.09, past which exp overflows; none when fixed."""
    found = results["numerics"]["buggy"]
    assert found is not None
    assert (found["phase"], found["module"], found["value"]) == ("forward", "criterion", "inf")
    assert found["input_max"] > math.log(torch.finfo(torch.float16).max)
    assert results["numerics"]["fixed"] is None


def test_account_sees_none_of_the_four(results) -> None:
    """The accounting measures what a step stores and computes; none of the four bugs
    changes that by more than 0.1% here (the page says so rather than claim a finding)."""
    found = results["account"]
    assert found["buggy"]["flops"] == found["fixed"]["flops"]
    assert math.isclose(found["buggy"]["saved_bytes"], found["fixed"]["saved_bytes"],
                        rel_tol=1e-3)


def _structure(run: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The run less what floating-point noise across machines and torch versions may move:
    the resume and numerics texts (they print differences and ranges), the byte counts, and
    the step at which the buggy fp16 loss first overflows (24 on torch 2.11.0 and 2.13.0, 20
    on 2.6.0, measured: the logits' last bits decide when they pass log(65504))."""
    out = {k: v for k, v in run.items() if k != "account"}
    for name in ("resume_check", "numerics"):
        out[name] = {side: (None if r is None else
                            {k: v for k, v in r.items()
                             if k not in ("text", "input_max", "step")})
                     for side, r in run[name].items()}
    return out


def test_the_committed_run_the_docs_print_is_this_run(results) -> None:
    """docs/data/my_trainer_checks.json (`python -m parity.lab.my_trainer_checks`) holds the
    same findings, lines and outputs as the run above."""
    assert _structure(checks.load()) == _structure(results)


def test_the_script_trains_on_one_thread(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/your-trainer.md: the script's steps run on the one thread it sets, whatever the
    process had (on two, ops this small waited for the slowest thread: 60 steps took 5 to
    19 s on a busy 2-core machine, 1.1 s on one)."""
    module = checks.example()
    step, seen = module.Trainer.step, []

    def counted(self: Any, *args: Any) -> None:
        seen.append(torch.get_num_threads())
        step(self, *args)

    monkeypatch.setattr(module.Trainer, "step", counted)
    monkeypatch.setattr(sys, "argv", ["my_trainer.py", "--fixed", "--steps", "2",
                                      "--out", str(tmp_path)])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the pytest process runs on one (conftest.py): as a shell's
    try:
        module.main()
    finally:
        torch.set_num_threads(threads)
    assert seen == [1, 1]


@pytest.mark.slow  # two runs of the script, ~4 s
def test_the_example_runs_as_a_script_and_its_checkpoint_is_audited(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python examples/my_trainer.py [--fixed]` trains and saves out/ckpt.pt; the audit of
    the buggy file says the scaler and the RNG are missing, of the fixed one not."""
    verdicts = []
    for flags in ([], ["--fixed"]):
        out = tmp_path / ("fixed" if flags else "buggy")
        done = subprocess.run([sys.executable, str(checks.EXAMPLE),
                               "--steps", "3", "--out", str(out), *flags],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == f"saved {out / 'ckpt.pt'}"
        main(["audit", str(out / "ckpt.pt")])
        verdicts.append(capsys.readouterr().out.splitlines()[-1])
    assert "torch CPU RNG" in verdicts[0] and "torch CPU RNG" not in verdicts[1]
