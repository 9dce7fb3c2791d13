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

import gc
import os
import re
import signal
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]  # the folder holding parity/, ckpt/, ...
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # parity/lab/cli/__init__.py's EXIT_STATUSES


def _drop_cwd_from_path() -> None:
    """NOTE [ A folder in the cwd shadows the project ]: remove the entry `python -m` put
    first on sys.path ('' or the cwd's path), unless the cwd is PROJECT."""
    cwd = Path.cwd().resolve()
    if cwd == PROJECT or not sys.path:
        return
    first = sys.path[0]
    if first == "" or Path(first).resolve() == cwd:
        del sys.path[0]


def program() -> str:
    """How the user invoked the program, for its messages and usage: the console script's
    own name (`mirrortrain`: sys.argv[0] is its path), else `python -m parity` (sys.argv[0]
    is this file's path)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if not name or name.startswith("-") or name.endswith(".py"):
        return "python -m parity"
    return name.removesuffix(".exe")


def _end_now(signum: int, frame: object) -> None:
    """A signal before the command line takes over (NOTE [ The first signal ends the run ] in
    parity/lab/cli/__init__.py): nothing is written yet; its one line, its status, exit."""
    word = sys.argv[1] if len(sys.argv) > 1 and re.fullmatch(r"[a-z-]+", sys.argv[1]) else ""
    terminated = signum == signal.SIGTERM
    line = "terminated (SIGTERM)" if terminated else "interrupted"
    os.write(2, f"{program()}{' ' + word if word else ''}: {line}\n".encode())
    os._exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


def entry() -> int:
    """Fix sys.path, pin the claims' BLAS setting where claims are checked, and run. A signal
    while this imports the command line ends the process with one line, 130 for Ctrl-C, 143
    for SIGTERM (_end_now); from then on main answers them. Once main has returned the
    process is ending, and both signals are ignored.

    A process that ends on a signal skips the garbage collector's passes over every object
    left (gc.freeze): with torch imported they cost about a second of the interpreter's
    teardown after the line is printed, and nothing of this project's needs them (files
    are closed, temporary files removed and worker processes ended as the stack unwinds)."""
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _end_now)
    try:
        _drop_cwd_from_path()
        from parity import setting

        if sys.argv[1:2] == ["sweep"]:  # claims checked in this process: their setting,
            setting.pin_blas()  # before NumPy loads (fuzz's pytest pins its own: conftest.py)

        from parity.lab.cli import main

        status = main(prog=program(), exits=True)
    finally:
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
    if status in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        # ended by a signal: the line is printed, files are closed, workers ended; the exit
        # hooks left are the interpreter's and the libraries' (concurrent.futures' wakes a
        # sweep executor whose pipe the kill may have closed, printing "Exception ignored"
        # now and then), so flush and leave without them
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(entry())
