"""`python -m parity` (and the console script `mirrortrain`, pyproject.toml's
[project.scripts], which calls `entry`): the command line (parity/lab/cli/, one module per
command).

NOTE [ A folder in the cwd shadows the project ]
`python -m` puts the current directory first on sys.path. The editable install
(`pip install -e .`: setuptools' `__editable__.mirrortrain-*.pth`) maps the project's
packages with a finder (`__editable___mirrortrain_*_finder._EditableFinder`) that it
APPENDS to sys.meta_path, after the standard PathFinder. So PathFinder, walking sys.path,
meets a folder `ckpt/` (or `common/`, `reference/`, `torch_impl/`) in the cwd first, and,
finding no regular package of that name on sys.path (the install put none there), accepts
the folder as a namespace package: `from ckpt import CheckpointError` fails ("cannot import
name ... (unknown location)") in a run whose `--checkpoint-dir ckpt` made that folder.
`entry` therefore drops the cwd from the front of sys.path before it imports anything of
the project, unless the cwd IS the folder that holds the project (a checkout run in place,
not installed, needs it). `parity` itself is imported by `python -m` before this file runs,
so a folder `parity/` in the cwd can still shadow `python -m parity`; the console script's
sys.path starts with its bin folder, not the cwd, and none of these folders shadow it.
parity/__init__.py imports nothing, so nothing was imported through the cwd before `entry`.
"""

import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]  # the folder holding parity/, ckpt/, ...


def _drop_cwd_from_path() -> None:
    """NOTE [ A folder in the cwd shadows the project ]: remove the entry `python -m` put
    first on sys.path ('' or the cwd's path), unless the cwd is PROJECT."""
    cwd = Path.cwd().resolve()
    if cwd == PROJECT or not sys.path:
        return
    first = sys.path[0]
    if first == "" or Path(first).resolve() == cwd:
        del sys.path[0]


def entry() -> int:
    """Fix sys.path, pin the claims' BLAS setting where claims are checked, and run."""
    _drop_cwd_from_path()
    from parity import setting

    if sys.argv[1:2] in (["fuzz"], ["sweep"]):  # claims checked here: their setting, before
        setting.pin_blas()  # NumPy loads

    from parity.lab.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(entry())
