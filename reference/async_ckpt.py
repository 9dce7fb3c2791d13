"""Asynchronous sharded checkpoints that cannot tear: the save returns once the state is
staged (copied), a background thread writes the copy and commits it, and the run trains on
meanwhile. The simulated ranks' twin of torch_impl/async_ckpt.py (dcp.async_save): the
same protocol, the same files as reference/sharded_ckpt.py's save, the same commit record
(ckpt/commit.py).

# NOTE [ An async save commits after its data is durable ]
1. Stage: before save() returns, every rank's state is COPIED into memory of its own (a
   view, or a buffer the next save reuses, would let the background write the values the
   live state has when it gets there: a later step's, under this step's name).
2. Write, in the background: every rank writes its copy and fsyncs its files (torch: its
   __<r>_0.distcp, the coordinator DCP's .metadata; here: rank-<r>.ckpt by the atomic write).
3. Commit, in the background, only after 2 finished on EVERY rank: each rank records its
   files' sizes and SHA-256 (fsyncing them again), the records are gathered (torch: an
   all-gather on the saves' own process group), and the coordinator writes the commit
   record (NOTE [ A checkpoint exists when its commit record does ] 3); a barrier ends it.
4. One save at a time: save() first waits for the previous save's commit (it does not
   refuse: a run asks for saves on its schedule, and the wait is the cost of a write
   slower than K steps). So two writes never share the staging buffer, the process group
   or the directory's newest record, and the records appear in step order.
5. A failure ends the run: a save that raised, or is not committed within its timeout,
   raises at the next wait (the next save or the end of the run) with one line naming the
   step. Its step directory holds no record, so it is no checkpoint; the previous commit
   is untouched (nothing writes into a committed step directory).

    save(parent, step, states):
        wait()                                 # rule 4: the previous commit, or its error
        staged = copy of every rank's state    # rule 1
        in the background:
            sharded_ckpt.save_sharded(parent, step, staged)   # rules 2, 3: files, then record
        return
    wait(): the background's result (raising its error in one line), within `timeout`

events: (what, step, start, end) in time.monotonic() seconds: "wait" (for the previous
commit), "stage", "write" (every rank's files), "commit" (digests and the record), as
torch_impl/async_ckpt.py records them.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import numpy as np

from ckpt import commit as ckc
from ckpt import commit_policy
from reference import resume
from reference import sharded_ckpt as sharded

PAYLOAD = resume.PAYLOAD  # an async save's files and record are a sync save's
MODES = ("copy",)  # torch's "pinned" (page-locked staging) has no NumPy counterpart


class AsyncSaveError(RuntimeError):
    """Rule 5: an async save failed or was not committed in time (one line, its step)."""


def now() -> float:
    """The events' clock: time.monotonic (one clock for every process of a machine)."""
    return time.monotonic()


def stage(state: Mapping[str, Any]) -> dict[str, Any]:
    """Rule 1: a copy of every entry (arrays copied, a generator's state dict deep-copied)."""
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray | np.generic)
            else copy.deepcopy(v) for k, v in state.items()}


class AsyncSaver:
    """The simulated ranks' asynchronous saves (the NOTE): one background thread."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit")
        self.pending: tuple[int, Future] | None = None
        self.events: list[tuple[str, int, float, float]] = []
        self._lock = threading.Lock()

    def _mark(self, what: str, step: int, t0: float, t1: float) -> None:
        with self._lock:
            self.events.append((what, step, t0, t1))

    def save(self, parent: str | os.PathLike, step: int, states: Sequence[Mapping[str, Any]],
             *, config: dict[str, Any] | None = None,
             gate: Callable[[], Any] | None = None,
             after_commit: Callable[[], None] | None = None) -> None:
        """Wait for the previous commit, stage `states` (states[r]: rank r's) and return;
        `gate` runs in the background before the write (a test holds it there);
        `after_commit` runs after the record (the run's pruning)."""
        if not states:
            raise ValueError("AsyncSaver.save: at least one rank's state")
        t0 = now()
        self.wait()
        self._mark("wait", step, t0, now())
        t0 = now()
        staged = [stage(s) for s in states]
        self._mark("stage", step, t0, now())
        self.pending = (step, self.pool.submit(self._write_and_commit, Path(parent), step,
                                               staged, config, gate, after_commit))

    def _write_and_commit(self, parent: Path, step: int, staged: list[dict[str, Any]],
                          config: dict[str, Any] | None, gate: Callable[[], Any] | None,
                          after_commit: Callable[[], None] | None) -> None:
        """Rules 2 and 3: reference/sharded_ckpt.py's save_sharded, step by step."""
        if gate is not None:
            gate()
        t0 = now()
        directory = ckc.make_fresh(parent, step)
        for r, state in enumerate(staged):  # on the engine each rank writes its own, at once
            resume.save_checkpoint(directory / f"rank-{r}.ckpt", state)
        self._mark("write", step, t0, now())
        t0 = now()
        entries = [ckc.file_entry(directory, f"rank-{r}.ckpt") for r in range(len(staged))]
        if config is not None:
            entries.append(ckc.write_config(directory, config))
        ckc.commit(parent, step, len(staged), PAYLOAD, entries)
        if after_commit is not None:
            after_commit()
        self._mark("commit", step, t0, now())

    def wait(self) -> int | None:
        """Rule 5: block until the pending save is committed; returns its step."""
        if self.pending is None:
            return None
        step, future = self.pending
        self.pending = None
        try:
            future.result(timeout=self.timeout)
        except FutureTimeout:
            raise AsyncSaveError(f"async save of step {step}: not committed after "
                               f"{self.timeout:g} s") from None
        except Exception as e:  # any failure of the write ends the run
            first = str(e).splitlines()[0] if str(e) else ""
            raise AsyncSaveError(f"async save of step {step} failed: {type(e).__name__}: "
                               f"{first}") from None
        return step

    def close(self) -> None:
        """Wait for the pending save, then release the thread."""
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=False)


def save_step(directory: str | os.PathLike, step: int, states: Sequence[Mapping[str, Any]], *,
              saver: AsyncSaver | None, config: dict[str, Any], keep: int) -> None:
    """Commit `states` (every simulated rank's) as `step`'s checkpoint, the newest `keep`
    kept: through `saver` (staged, written in the background, pruned after its commit) or,
    without one, in place (sharded_ckpt.save_sharded, then the prune)."""
    if saver is not None:
        saver.save(directory, step, states, config=config,
                   after_commit=lambda: commit_policy.prune(directory, keep))
        return
    sharded.save_sharded(directory, step, states, config=config)
    commit_policy.prune(directory, keep)
