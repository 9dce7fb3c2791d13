"""Resuming one tree from the other's checkpoint through the command line and the library
(resume.cross_impl_resume): the resume topic's file, so that `python -m parity report
--topic resume` runs the test that asserts it. Drivers: parity/drivers/train.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers.train import cross_impl_resume


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize(("model", "precision"), [("mlp", "fp32"), ("gpt", "fp32"),
                                                  ("gpt", "bf16-sr"), ("gpt", "nvfp4")])
@pytest.mark.parametrize(("writer", "reader"), [("reference", "torch"), ("torch", "reference")])
def test_resume_from_the_other_implementation_continues_exactly_where_it_can(
        writer: str, reader: str, model: str, precision: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], device: str) -> None:
    """The command line continues the other tree's checkpoint, MLP or transformer, bf16-sr's
    own optimizer and the random bits of stochastic rounding among it: at its step the same
    digest; continued, the same step, data position, skipped count, lr and bit stream as a
    run of its own."""
    from parity.lab.cli import main

    base = ["--steps", "5", "--horizon", "9", "--checkpoint-dir", str(tmp_path),
            "--checkpoint-every", "5", "--seed", "3", "--model", model, "--precision",
            precision]

    def argv(name: str) -> list[str]:
        return ["train", "--impl", name, *base, *(["--device", device] if name == "torch"
                                                  else [])]

    assert main([*argv(writer), "--quiet"]) == 0
    written = capsys.readouterr().out.split()[-1]
    assert main([*argv(reader), "--resume"]) == 0
    out, err = capsys.readouterr()  # the resume line is a notice: stderr
    lines = out.splitlines()
    assert err.startswith("resumed from ckpt-00000005.ckpt at step 5 (written by ")
    assert_claim("resume.cross_impl_resume",
                 actual=np.frombuffer(bytes.fromhex(lines[-1].split()[1]), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(written), np.uint8))
    with tempfile.TemporaryDirectory() as tmp:  # the library's path, continued past k
        for what, actual, expected in cross_impl_resume(writer, reader, Path(tmp), device,
                                                        model, precision):
            assert_claim("resume.cross_impl_resume", actual=actual, expected=expected, context=what)
