"""The command line run from a folder that holds folders named like the project's packages:
`python -m parity` and the console script `mirrortrain` still import the project, not those
folders (NOTE [ A folder in the cwd shadows the project ] in parity/__main__.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHADOWS = ("ckpt", "common", "reference", "torch_impl")  # parity/ shadows `python -m` itself
TRAIN = ["train", "--impl", "reference", "--steps", "4", "--checkpoint-every", "2",
         "--checkpoint-dir", "ckpt", "--quiet"]


# How the editable install finds the project (NOTE [ A folder in the cwd shadows the project ]
# in parity/__main__.py): a finder put on sys.meta_path after PathFinder. Put on
# PYTHONPATH as sitecustomize.py, it maps the packages to THIS checkout, which PYTHONPATH=ROOT
# cannot stand in for: a regular package on sys.path beats a namespace folder in the cwd.
EDITABLE_FINDER = """
import importlib.machinery, importlib.util, sys
ROOT = {root!r}
class Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in ("ckpt", "common", "parity", "reference", "torch_impl"):
            return importlib.util.spec_from_file_location(
                fullname, f"{{ROOT}}/{{fullname}}/__init__.py",
                submodule_search_locations=[f"{{ROOT}}/{{fullname}}"])
        return None
# right after PathFinder: before the real install's finder, which maps another checkout
sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, Finder)
"""


def _env(site: Path) -> dict[str, str]:
    """This checkout found as the editable install finds it, one BLAS thread."""
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(root=str(ROOT)))
    return {**os.environ, "PYTHONPATH": str(site), "OPENBLAS_NUM_THREADS": "1"}


def _shadowed(tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    for name in SHADOWS:
        (tmp_path / name).mkdir()
    return tmp_path


def _train_then_resume(command: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """Train, then --resume the same run, from `cwd`; both must exit 0. The digests."""
    digests = []
    for extra in ([], ["--resume"]):
        done = subprocess.run([*command, *TRAIN, *extra], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.append(done.stdout.split()[-1])
    return digests


def test_python_m_parity_trains_and_resumes_beside_folders_named_like_its_packages(
        tmp_path: Path) -> None:
    """From a cwd holding empty ckpt/, common/, reference/, torch_impl/ folders, `python -m
    parity train` then `--resume` into `--checkpoint-dir ckpt` both exit 0, same digest."""
    cwd = _shadowed(tmp_path / "cwd")
    first, resumed = _train_then_resume([sys.executable, "-m", "parity"], cwd,
                                        _env(tmp_path / "site"))
    assert len(first) == 64 and resumed == first
    assert sorted(p.name for p in (cwd / "ckpt").iterdir())[-1] == "ckpt-00000004.ckpt"


@pytest.mark.slow  # python -m (above) runs the same entry; the script's sys.path is its bin
def test_the_console_script_trains_and_resumes_beside_folders_named_like_its_packages(
        tmp_path: Path) -> None:
    """The same through `mirrortrain`, the console script pyproject.toml declares."""
    script = shutil.which("mirrortrain")
    if script is None:
        pytest.skip("no `mirrortrain` on PATH: the project was installed before "
                    "[project.scripts] declared it (pip install -e . --no-deps adds it)")
    first, resumed = _train_then_resume([script], _shadowed(tmp_path), dict(os.environ))
    assert len(first) == 64 and resumed == first


@pytest.mark.slow  # the installed console script (above) is the same check where pip ran
def test_a_script_like_pips_calling_the_entry_trains_and_resumes_beside_those_folders(
        tmp_path: Path) -> None:
    """What pip writes for [project.scripts] (a file in a bin folder importing the entry and
    exiting with its status), run from the shadowed cwd: its sys.path[0] is the bin folder."""
    module, _, name = _scripts()["mirrortrain"].partition(":")
    script = tmp_path / "bin" / "mirrortrain"
    script.parent.mkdir()
    script.write_text(f"import sys\nfrom {module} import {name}\nsys.exit({name}())\n")
    first, resumed = _train_then_resume([sys.executable, str(script)],
                                        _shadowed(tmp_path / "cwd"), _env(tmp_path / "site"))
    assert len(first) == 64 and resumed == first


def _scripts() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11's")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_console_script_is_the_entry_python_m_parity_runs() -> None:
    """pyproject.toml's `mirrortrain` names parity.__main__.entry, the function `python -m
    parity` calls, so the two are one command line."""
    from parity import __main__ as entry_point

    module, _, name = _scripts()["mirrortrain"].partition(":")
    assert module == entry_point.__name__ and callable(getattr(entry_point, name))
