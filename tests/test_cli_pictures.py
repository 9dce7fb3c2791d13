"""Without matplotlib (the optional extra `plot`) a command that draws pictures still does its
work, links no picture it did not draw, and says in one line on stderr that the pictures were
skipped and how to install the extra. Run as a user runs it: a subprocess in which importing
matplotlib fails as an absent package does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
SKIPPED = ('python -m parity {}: pictures skipped: matplotlib is not installed (pip install -e '
           '".[plot]" in a checkout, pip install "mirrortrain[plot]" otherwise)')

# `python -m parity ARGS` with matplotlib's import failing as an absent package's does
WITHOUT_MATPLOTLIB = """import runpy, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
sys.argv[0] = "__main__.py"
runpy.run_module("parity", run_name="__main__", alter_sys=True)
"""


def _run(args: list[str], cwd: Path, matplotlib: bool) -> subprocess.CompletedProcess[str]:
    command = ["-m", "parity"] if matplotlib else ["-c", WITHOUT_MATPLOTLIB]
    return subprocess.run([sys.executable, *command, *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def _lines(stderr: str) -> list[str]:
    """stderr's lines, a progress bar's redrawn states (carriage returns) left out."""
    return [line.rsplit("\r", 1)[-1] for line in stderr.splitlines(keepends=False)
            if line.rsplit("\r", 1)[-1].strip()]


def _missing_links(page: Path) -> list[str]:
    targets = re.findall(r"\]\(([^)#\s]+)\)", page.read_text(encoding="utf-8"))
    return [t for t in targets if "://" not in t and not (page.parent / t).exists()]


PROFILE = ["profile", "--impl", "reference", "--steps", "5", "--wait", "1", "--warmup", "1",
           "--active", "2", "--out", "out"]


@pytest.mark.parametrize("matplotlib", [False, True], ids=["without", "with"])
def test_profile_links_exactly_the_pictures_it_drew(matplotlib: bool, tmp_path: Path) -> None:
    if matplotlib:
        pytest.importorskip("matplotlib", reason="the pictures need the 'plot' extra")
    done = _run(PROFILE, tmp_path, matplotlib)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    drawn = sorted(p.name for p in out.glob("*.png"))
    assert drawn == (["memory.png", "phases.png"] if matplotlib else [])
    page = (out / "profile.md").read_text(encoding="utf-8")
    assert sorted(re.findall(r"\]\((\w+\.png)\)", page)) == drawn
    assert _missing_links(out / "profile.md") == []
    said = [line for line in _lines(done.stderr) if "pictures" in line]
    assert said == ([] if matplotlib else [SKIPPED.format("profile")]), done.stderr


@pytest.mark.slow  # a whole optimize run, about 9 s; profile's test above covers the same
def test_optimize_without_matplotlib_says_so_and_links_no_picture(  # path in the default run
        tmp_path: Path) -> None:
    done = _run(["optimize", "--what", "autocast-bf16", "--repeats", "3", "--steps", "1",
                 "--out", "out"], tmp_path, matplotlib=False)
    assert done.returncode in (0, 1), done.stderr  # the verdict is the gauntlet's
    assert list((tmp_path / "out").glob("*.png")) == []
    assert "](" not in (tmp_path / "out" / "optimize-autocast-bf16.md").read_text()
    assert [line for line in _lines(done.stderr) if "pictures" in line] == [
        SKIPPED.format("optimize")], done.stderr
