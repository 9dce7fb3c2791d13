"""The sweep's worker processes (parity/sweep.py): started by fork, ended at once on an
interrupt, and a progress bar that an interrupt erases."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext

from tqdm import tqdm

# NOTE [ Ending the workers ]
# An interrupt ends the workers at once (left alone, the executor waits at exit for every
# pending chunk). A terminal's Ctrl-C reaches the whole group: the workers ignore SIGINT, and
# SIGTERM ends one at once (the default action, not the handler a fork inherits); both are
# blocked across the fork. The parent, on KeyboardInterrupt (Terminated included), ignores
# both while it cancels what has not started and kills its workers (a chunk holds nothing to
# clean up; no lock a killed worker held blocks the executor's reading), then re-raises.
_STOP = {signal.SIGINT, signal.SIGTERM}


def worker_start() -> None:
    """A worker's initializer: NOTE [ Ending the workers ]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back from this thread and what it starts, for the block."""
    blocking = hasattr(signal, "pthread_sigmask")
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP) if blocking else None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def erased_bar(**kwargs: object) -> Iterator[tqdm]:
    """tqdm's bar, erased (not left) if interrupted: the command's one line says what happened."""
    with tqdm(**kwargs) as b:
        try:
            yield b
        except BaseException:
            b.leave = False
            raise


def end_workers(pool: ProcessPoolExecutor, workers: set[multiprocessing.Process]) -> None:
    """NOTE [ Ending the workers ], with both signals ignored meanwhile (in the main thread)."""
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in _STOP} if main else {}
    try:
        pool.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            p.kill()
            p.join()
        pool.shutdown(wait=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def worker_context() -> BaseContext:
    """fork where the platform has it: a forked worker starts with this process's modules
    (torch, ml_dtypes) imported, where a spawned one imports them again, about 1.6 s of CPU
    time each (a tenth of a float8 sweep's wall time on 2 cores). Each worker sets torch to
    one thread before its first chunk, so it never enters a parallel region: a thread pool
    the parent may have started is not used in the child. spawn where fork is unavailable."""
    return get_context("fork" if "fork" in get_all_start_methods() else "spawn")
