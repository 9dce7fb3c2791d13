"""What a learner reads: the --check-numerics table says which steps it counts and keeps its
columns aligned for any module name."""

from __future__ import annotations

from pathlib import Path

import pytest

from parity.lab.cli import train as train_cli
from tests.test_cli import assert_one_line_error, run_cli


def test_the_numerics_table_names_the_steps_this_process_ran(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["train", "--impl", "reference", "--checkpoint-dir", str(tmp_path), "--horizon", "5",
           "--check-numerics"]
    assert run_cli([*run, "--steps", "3"], capsys)[0] == 0
    status, out, _ = run_cli([*run, "--steps", "5", "--resume"], capsys)
    assert status == 0
    head = [line for line in out.splitlines() if line.startswith("counts")]
    assert len(head) == 1 and head[0].split()[:6] == ["counts", "over", "2", "steps", "(4",
                                                      "to"], head


def test_the_numerics_table_aligns_long_module_names() -> None:
    names = ["act:a", "grad:transformer.h.11.attn.c_attn.weight_with_a_long_suffix"]
    text = train_cli._table([{n: [1, 22, 333, 4444, 5, 6] for n in names}], "counts of step 7")
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, text  # every column ends where the head's
    ends = [line.index(" 1 ") if " 1 " in line else None for line in lines[1:]]
    assert ends[0] == ends[1], text


@pytest.mark.parametrize("kind", ["folder", "fifo", "missing"])
def test_replay_says_what_the_path_is(kind: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import os

    path = tmp_path / "x"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this platform")
        os.mkfifo(path)
    status, _, err = run_cli(["replay", str(path), "--impl", "reference"], capsys)
    word = {"folder": "is a folder", "fifo": "not a regular file", "missing": "no such file"}
    assert_one_line_error(status, err, str(path), word[kind])


@pytest.mark.parametrize("command", [["account", "--model", "mlp"],
                                     ["profile", "--impl", "reference"]])
def test_a_negative_looking_value_is_named_not_called_missing(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli([*command, "--sizes", "-3,4,5"], capsys)
    assert_one_line_error(status, err, "'-3,4,5' starts with '-'", "--sizes=-3,4,5")
    status, _, err = run_cli([*command, "--sizes=-3,4,5"], capsys)  # then its own check
    assert_one_line_error(status, err, "positive")
