"""The command line in the user's environment: a dependency that is not installed is one line
naming it and the command that installs it (exit status 2), and every message names the
program as it was invoked (`mirrortrain`, the console script, or `python -m parity`). Run as
a user runs it, in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import REQUIRED, TEST_EXTRA, missing_dependency
from tests.test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

# What pip's console script for [project.scripts] `mirrortrain = "parity.__main__:entry"` runs
CONSOLE_SCRIPT = "import sys\nfrom parity.__main__ import entry\nsys.exit(entry())\n"

# A process in which importing `blocked` (or any of its submodules) fails as an absent
# package does, then the console script: sys.argv = [script path, blocked, args...]
WITHOUT = """import sys
blocked = sys.argv.pop(1)
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
""" + CONSOLE_SCRIPT


def _run(script: str, args: list[str], tmp_path: Path, name: str = "mirrortrain"
         ) -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    path.write_text(script)
    return subprocess.run([sys.executable, str(path), *args], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("blocked", "args"), [
    ("xxhash", ["tolerances"]),  # the checkpoint digest, imported while the parser is built
    ("numpy", ["ranges"]),
    ("ml_dtypes", ["ranges"]),
    ("tqdm", ["sweep", "float16", "--sample", "16"]),
    ("torch", ["sweep", "float16", "--sample", "16"]),
])
def test_a_missing_required_dependency_is_one_line_naming_it(blocked: str, args: list[str],
                                                             tmp_path: Path) -> None:
    done = _run(WITHOUT, [blocked, *args], tmp_path)
    assert_one_line_error(done.returncode, done.stderr, f"mirrortrain {args[0]}: error:",
                          f"{blocked} is not installed", f"pip install {REQUIRED[blocked]}")


@pytest.mark.parametrize(("blocked", "args"), [
    ("pytest", ["report", "--topic", "data"]),  # its tests run in pytest subprocesses
    ("hypothesis", ["report", "--topic", "data"]),
    ("xdist", ["report", "--topic", "data"]),  # it spreads the tests over the cores
    ("hypothesis", ["fuzz", "--seconds", "1"]),
])
def test_a_missing_test_extra_is_one_line_naming_its_install(blocked: str, args: list[str],
                                                             tmp_path: Path) -> None:
    done = _run(WITHOUT, [blocked, *args], tmp_path)
    assert_one_line_error(done.returncode, done.stderr, f"{blocked} is not installed",
                          'pip install -e ".[test]"', 'pip install "mirrortrain[test]"')
    assert not (tmp_path / "report").exists()  # refused before the report's folder is made


def test_a_missing_module_that_is_no_dependency_stays_a_real_error(tmp_path: Path) -> None:
    """Only the declared dependencies are the user's environment: any other missing module
    (here the standard library's fractions, which parity/oracles.py imports) is a bug, with
    its traceback and exit status 1."""
    done = _run(WITHOUT, ["fractions", "ranges"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "No module named 'fractions'" in done.stderr
    assert missing_dependency(ModuleNotFoundError(name="fractions")) is None
    assert missing_dependency(ModuleNotFoundError(name="numpy.linalg")) == (
        "numpy.linalg is missing from numpy (a required dependency); install it: pip install "
        "numpy (or reinstall this project: pip install -e . in a checkout)")


def test_the_dependencies_named_are_pyprojects() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requirements}  # type: ignore[union-attr]

    assert set(REQUIRED.values()) == names(project["dependencies"])
    assert set(TEST_EXTRA.values()) == names(project["optional-dependencies"]["test"])
    assert project["scripts"]["mirrortrain"] == "parity.__main__:entry"


@pytest.mark.parametrize(("name", "prog"), [("mirrortrain", "mirrortrain"),
                                            ("__main__.py", "python -m parity")])
def test_messages_name_the_program_as_it_was_invoked(name: str, prog: str,
                                                     tmp_path: Path) -> None:
    """The console script says `mirrortrain` (argparse's errors, a command's own refusal,
    --help's usage and description); run as a module's __main__.py, `python -m parity`."""
    bad = _run(CONSOLE_SCRIPT, ["sweep", "float32"], tmp_path, name)
    assert_one_line_error(bad.returncode, bad.stderr, f"{prog} sweep: error: argument format",
                          f"(see {prog} sweep --help)")
    refused = _run(CONSOLE_SCRIPT, ["sweep", "float16", "--record"], tmp_path, name)
    assert_one_line_error(refused.returncode, refused.stderr,
                          f"{prog} sweep: error: --record stores exhaustive sweeps only")
    helped = _run(CONSOLE_SCRIPT, ["train", "--help"], tmp_path, name)
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {prog} train ")
    assert f"    {prog} train --impl {{reference,torch}}" in helped.stdout
    other = "python -m parity" if prog == "mirrortrain" else "mirrortrain"
    assert re.search(rf"{other}(?![.\w])", helped.stdout) is None, helped.stdout


def test_the_readme_keeps_python_m_parity() -> None:
    """The README's command reference is rendered with the parser's default name."""
    from parity.lab.cli import PROG, build_parser

    assert PROG == "python -m parity"
    assert build_parser().format_usage().startswith("usage: python -m parity ")
