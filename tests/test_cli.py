"""Every command of `python -m parity` refuses bad input with ONE line on stderr naming what
was wrong and what is accepted, and a non-zero exit status; never a traceback, never a
vacuous success. Driven through the real entry point (parity.lab.cli.main), and a few through a
subprocess as a user runs them. (`train`'s own flags are tested with the training topic.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.claims import TOPICS
from parity.lab import cli, gendocs
from parity.lab.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(args)
    except SystemExit as e:  # argparse's own errors exit from inside parse_args
        status = e.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(status: int, err: str, *words: str) -> None:
    assert status == EXIT_USAGE, (status, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize(("args", "words"), [
    ([], ["COMMAND"]),
    (["bogus"], ["bogus", "report", "fuzz", "docs"]),
    (["report", "--topic", "bogus"], ["--topic", "bogus", *TOPICS]),
    (["report", "--topic"], ["--topic", "expected one argument"]),
    (["report", "--record", "--topic", "formats"], ["--record", "drop --topic"]),
    (["sweep", "float16", "--sample", "0"], ["--sample", "0", "minimum 1"]),
    (["sweep", "float16", "--sample", "-5"], ["--sample", "-5", "minimum 1"]),
    (["sweep", "float16", "--sample", "1e3"], ["--sample", "'1e3' is not an integer"]),
    (["sweep", "float16", "--workers", "0"], ["--workers", "0", "minimum 1"]),
    (["sweep", "float32"], ["float32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3fn"]),
    (["sweep", "float16", "--exhaustive", "--sample", "5"], ["--sample", "--exhaustive"]),
    (["sweep", "float16", "--seed", "-1"], ["--seed", "-1"]),
    (["fuzz", "--seconds", "0"], ["--seconds", "0", "(0, inf)"]),
    (["fuzz", "--seconds", "-3"], ["--seconds", "-3"]),
    (["fuzz", "--seconds", "nan"], ["--seconds", "nan", "finite"]),
    (["fuzz", "--seconds", "inf"], ["--seconds", "inf", "finite"]),
    (["fuzz", "--seconds", "soon"], ["--seconds", "'soon' is not a number"]),
    (["fuzz", "--topic", "bogus"], ["--topic", "bogus", *TOPICS]),
    (["fuzz", "--seed", "-1"], ["--seed", "-1"]),
    (["fuzz", "--device", "tpu"], ["--device", "tpu", "cpu", "cuda"]),
    (["tolerances", "extra"], ["unrecognized arguments: extra"]),
    (["ranges", "--topic", "formats"], ["unrecognized arguments"]),
    (["docs", "--pictures"], ["unrecognized arguments"]),
])
def test_bad_arguments_get_one_line_and_exit_2(args: list[str], words: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(args, capsys)
    assert_one_line_error(status, err, *words)


def test_fuzz_on_cuda_without_cuda_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    status, out, err = run_cli(["fuzz", "--device", "cuda", "--seconds", "1"], capsys)
    assert_one_line_error(status, err, "--device cuda", "is_available() is False")
    assert out == ""


@pytest.mark.parametrize("make", ["file", "inside_a_file"])
def test_report_refuses_an_unusable_out_folder_before_checking(
        make: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file where the folder should be is refused at once (no claim is checked first)."""
    import parity.lab.report

    monkeypatch.setattr(parity.lab.report, "run",
                        lambda topic, meanwhile=None: pytest.fail("tests ran"))
    target = tmp_path / "a_file"
    target.write_text("x")
    out = target if make == "file" else target / "sub"
    status, _, err = run_cli(["report", "--out", str(out)], capsys)
    assert_one_line_error(status, err, "--out", str(out))


def test_report_that_checks_nothing_fails(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Never '0/0 claims hold' with exit status 0."""
    import parity.lab.report

    monkeypatch.setattr(parity.lab.report, "run",
                        lambda topic, meanwhile=None: parity.lab.report.Result([], [], 0.0))
    status, out, _ = run_cli(["report", "--out", ""], capsys)
    assert status == EXIT_FAILED
    assert "no claims checked" in out and "0/0" not in out


def test_report_json_writes_non_finite_values_as_strings() -> None:
    """JSON has no infinity: an infinite or NaN observation is written as "inf"/"nan"."""
    from parity.lab.cli.report import as_json
    from parity.lab.report import Observation, Row
    from parity.tolerances import CLAIMS

    rows = [Row(CLAIMS[0], Observation(math.inf, 3, raw=math.nan), "FAIL", 0.1),
            Row(CLAIMS[1], None, "NOT CHECKED", 0.0)]
    text = json.dumps(as_json(rows), allow_nan=False)
    back = json.loads(text)
    assert (back[0]["observed"], back[0]["raw"], back[0]["verdict"]) == ("inf", "nan", "FAIL")
    assert (back[1]["observed"], back[1]["n"], back[1]["verdict"]) == (None, None, "NOT CHECKED")


def test_docs_outside_a_source_checkout_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel install has no docs/ (nor pyproject.toml) beside the package: one line, exit 2,
    nothing written."""
    monkeypatch.setattr(gendocs, "DOCS", tmp_path / "docs")
    status, out, err = run_cli(["docs"], capsys)
    assert_one_line_error(status, err, "no source checkout", "pip install -e .")
    assert out == "" and not (tmp_path / "docs").exists()
    (tmp_path / "docs").mkdir()  # a stray docs/ folder without the checkout around it
    status, _, err = run_cli(["docs"], capsys)
    assert_one_line_error(status, err, "no source checkout")


def test_ctrl_c_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import parity.lab.cli.tolerances

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(parity.lab.cli.tolerances, "run", interrupted)
    status, _, err = run_cli(["tolerances"], capsys)
    assert status == EXIT_INTERRUPTED
    assert err.strip() == "python -m parity tolerances: interrupted"


def test_every_command_is_listed_and_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(["--help"], capsys)
    assert status == 0
    for name in cli.COMMANDS:
        assert name in out


@pytest.mark.parametrize(("args", "words"), [
    (["report", "--topic", "nope"], ["invalid choice: 'nope'", "formats"]),
    (["fuzz", "--seconds", "nan"], ["--seconds", "nan"]),
])
def test_a_user_running_the_module_sees_one_line_and_exit_2(args: list[str],
                                                            words: list[str],
                                                            tmp_path: Path) -> None:
    """As a user types it, from another folder: `python -m parity ...`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "parity", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(done.returncode, done.stderr, *words)
    assert done.stdout == ""


def test_a_usage_error_does_not_import_torch(tmp_path: Path) -> None:
    """Building the parser (every command's arguments) and refusing a bad flag stays
    torch-free: `python -m parity profile --impl nope` answers in a fraction of torch's
    import time. The subprocess reports which heavy modules it loaded."""
    code = ("import sys\nfrom parity.lab.cli import main\n"
            "try:\n    main(['profile', '--impl', 'nope'])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "invalid choice: 'nope'" in done.stderr, done.stderr
    assert done.stdout.split() == [str(EXIT_USAGE), "False"], done.stdout


def test_the_parsers_choices_are_the_drivers() -> None:
    """The choices parity/lab/cli spells out to stay torch-free (and ml_dtypes-free) are the
    drivers' own."""
    from parity import oracles
    from parity.drivers import accounting
    from parity.drivers import profile as profile_driver
    from parity.lab.cli import account, profile, sweep

    assert (profile.IMPLS, profile.MODELS) == (profile_driver.IMPLS, profile_driver.MODELS)
    assert sweep.SWEEP_FORMATS == oracles.SWEEP_FORMATS
    assert (account.MODELS, account.OPTIMIZERS, account.PRECISIONS) == (
        accounting.MODELS, tuple(accounting.OPTIMIZERS), accounting.PRECISIONS)


@pytest.mark.parametrize("value", ["4", "4,8,2", "0,8", "4,x", ","])
def test_a_batch_shape_that_is_not_two_positive_integers_is_one_line(value: str,
                                                                     tmp_path: Path) -> None:
    """--batch-shape names the form it takes: the factory unpacks (B, T), and '4' once came
    back from it as "not enough values to unpack"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "parity", "account", "--module",
                           "examples.models:convnet", f"--batch-shape={value}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert_one_line_error(done.returncode, done.stderr, "--batch-shape", repr(value),
                          "expected B,T, two positive integers")
