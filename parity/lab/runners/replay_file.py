"""The replay file `python -m parity train --check-numerics` writes when it stops at the first
invalid value, for `python -m parity replay`.

NOTE [ A replay file replaces nothing ]
The checkpoint directory is the user's data (DESIGN.md, Safety of state): a run never
overwrites a file it did not write. A second run into the same directory that stops at the
same step would otherwise replace the first run's first-invalid-step<N>.replay without a word,
the one record of what that run found. So the file gets the first free name of
first-invalid-step<N>.replay, first-invalid-step<N>-2.replay, -3, ...; the name is taken by
creating the file exclusively (O_EXCL: no other run can take it meanwhile), and the replay
state is then written over that empty file of this run's own (atomically, as a checkpoint
is). When the name is not the first, a line on stderr says which file was kept and which was
written; the `replay:` line names the file either way.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replay_name(step: int, k: int = 1) -> str:
    """The k-th name for a replay of step `step`: k = 1 the plain one."""
    return f"first-invalid-step{step}.replay" if k == 1 else f"first-invalid-step{step}-{k}.replay"


def claim(directory: Path, step: int) -> Path:
    """Create (exclusively, empty) the first free replay name in `directory` and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for k in itertools.count(1):
        path = directory / replay_name(step, k)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def write_replay(impl: str, directory: Path, step: int, replay: dict[str, Any],
                 notify: Callable[[str], None]) -> Path:
    """Write the replay state of `step` into `directory` under a name no file held before
    (NOTE [ A replay file replaces nothing ]); say so through `notify` when the plain name was
    taken. Returns the file's path."""
    from parity.drivers.numerics import save_replay

    path = claim(directory, step)
    try:
        save_replay(impl, path, replay)
    except BaseException:
        path.unlink(missing_ok=True)  # the empty file this run created, nothing else
        raise
    if path.name != replay_name(step):
        notify(f"train: {replay_name(step)} in {directory} is an earlier run's and is kept; "
               f"this run's replay is {path.name}")
    return path
