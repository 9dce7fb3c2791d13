"""A command's --out never overwrites a user's file: a folder holding files the project did not
write is refused before any work, in one line naming what it holds; a folder the command made
is its own, and a rerun into it works (NOTE [ An output folder is the command's own ])."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import OUTPUT_MARK, UsageError, output_folder
from tests.test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_miniproject_refuses_a_folder_holding_the_users_postmortem(tmp_path: Path) -> None:
    """The reported loss, through the real command line: the user's own postmortem.md is left
    byte for byte, and nothing was graded (the refusal comes first)."""
    mine = tmp_path / "postmortem.md"
    mine.write_text("my own notes\n")
    done = subprocess.run([sys.executable, "-m", "parity", "miniproject", "--out",
                           str(tmp_path)], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done.returncode, done.stderr, "--out", "postmortem.md",
                          "new or empty folder")
    assert mine.read_text() == "my own notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["postmortem.md"]


@pytest.mark.parametrize("command", [["report"], ["optimize", "--what", "autocast-bf16"],
                                     ["profile", "--impl", "reference"],
                                     ["miniproject"]])
def test_every_command_with_an_out_folder_refuses_one_it_did_not_write(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a.png", "b.md", "c.json", "d.txt"):
        (tmp_path / name).write_text(name)
    status, _, err = run_cli([*command, "--out", str(tmp_path)], capsys)
    assert_one_line_error(status, err, "--out", "a.png, b.md, c.json and 1 more")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.md", "c.json", "d.txt"]
    assert all((tmp_path / n).read_text() == n for n in ("a.png", "b.md", "c.json", "d.txt"))


def test_a_folder_the_command_made_is_its_own_and_an_empty_one_is_taken(tmp_path: Path
                                                                       ) -> None:
    made = output_folder(str(tmp_path / "new" / "deep"), command="report")
    assert (made / OUTPUT_MARK).read_text() == "written by python -m parity report\n"
    (made / "picture.png").write_text("from the first run")
    assert output_folder(str(made), command="report") == made  # a rerun: its own folder
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (output_folder(str(empty)) / OUTPUT_MARK).is_file()
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(UsageError, match="did not write"):
        output_folder(str(tmp_path))
