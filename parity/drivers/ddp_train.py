"""`python -m parity train --world-size N` run, killed and resumed: the runs the claim
ddp.cli_kill_resume compares (parity/test_ddp_train.py).

A torch rank is a process of its own, so a rank is killed while the command runs in this
process (the test's parity.lab.cli.main in a thread: its launch then fails);
the reference's ranks live in the command's process, so that process is started and killed.
A kill lands at a point of a save, found by watching the checkpoint directory: `victim`
"rank" is SIGKILLed once the last rank's file of the targeted step appears (rank N-1 has
begun writing its share, nothing is committed), "coordinator" (rank 0, which writes DCP's
.metadata and the commit record) once the step directory holds everything but the record
(torch: .metadata; reference: config.json, written last before the record). The process is
SIGSTOPped the moment its point is seen, then killed, so that reading /proc for its children
(some ms) cannot let the save finish first. A kill that
comes too late (the record landed first) is retried at the next save: the kills report the
step they hit, and the caller checks that its record is absent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ckpt import commit as ckc

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 10, 2  # saves at 2, 4, ..., 10: the kills aim at 4 (6, 8 if too late)
# fp16 with skipped steps (4 and 8 or 9 at 2, 3, 4 ranks, both trees), every rank drawing;
# the first step after each commit a kill falls back to (3, 5, 7) is not skipped: its
# reduction is the one the bucket layout after a resume decides (NOTE [ DDP's buckets after
# a resume ]), which a skipped step's inf gradients would hide (the tests guard it)
OPTIONS = ("--precision", "fp16", "--init-scale", "131072", "--growth-interval", "3",
           "--dropout", "0.1", "--keep", "2")
VICTIMS = ("rank", "coordinator")
_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def argv(impl: str, directory: Path, world_size: int, steps: int = STEPS,
         options: tuple[str, ...] = OPTIONS) -> list[str]:
    """The command's arguments after `python -m parity` (`options`: the run's; the GPT's
    runs add --model gpt and theirs, parity/drivers/ddp_gpt.py)."""
    return ["train", "--impl", impl, "--steps", str(steps), "--checkpoint-dir", str(directory),
            "--checkpoint-every", str(EVERY), "--world-size", str(world_size), "--resume",
            *options]


def payload(impl: str) -> str:
    """The payload of `impl`'s commit records (torch is imported only when asked for)."""
    if impl == "torch":
        from torch_impl import ddp_train
    else:
        from reference import ddp_train  # type: ignore[no-redef]
    return ddp_train.PAYLOAD


def digest(lines: list[str]) -> str:
    """The 64 hex digits of the last line, `state-sha256: ...`."""
    assert lines and lines[-1].startswith("state-sha256: "), lines[-3:]
    return lines[-1].removeprefix("state-sha256: ")


def _marker(impl: str, victim: str, world_size: int) -> tuple[str, bool]:
    """The file whose appearance in the targeted step directory triggers the kill, and
    whether its atomic write's temporary name counts too (being written) or only the final
    name (written: the reference's config.json, its coordinator's last file before the
    record, about 1 ms before it here)."""
    last = world_size - 1
    if victim == "rank":
        return (f"__{last}_0.distcp" if impl == "torch" else f"rank-{last}.ckpt"), True
    if victim == "command":
        return ("__0_0.distcp" if impl == "torch" else "rank-0.ckpt"), True
    return (".metadata", True) if impl == "torch" else (ckc.CONFIG, False)


def _await_save(directory: Path, marker: tuple[str, bool], after: int,
                alive: Callable[[], bool], timeout: float) -> int | None:
    """The first step after `after` whose directory shows `marker` (_marker), None if the
    run ended first."""
    name, temporary = marker
    deadline = time.monotonic() + timeout
    targets = [ckc.step_dir(directory, s) for s in range(after + EVERY, STEPS, EVERY)]
    while alive() and time.monotonic() < deadline:
        for step, target in zip(range(after + EVERY, STEPS, EVERY), targets, strict=True):
            try:
                names = os.listdir(target)
            except FileNotFoundError:
                continue
            if any(n == name or (temporary and n.startswith(f".{name}.")) for n in names):
                return step
        time.sleep(0.0002)
    return None


def kill_until_hit(kill: Callable[[int], tuple[int, int | None]], directory: Path,
                   tries: int = 3) -> tuple[int, int]:
    """(exit status, step) of the first of `tries` kills that came before its save's
    commit record; each try resumes the run the last one left, aiming at a later save."""
    after = EVERY  # the first save is left committed: the kills aim at 2 EVERY on
    for _ in range(tries):
        status, hit = kill(after)
        assert hit is not None, "the kill never found its save"
        if not ckc.record_path(directory, hit).exists():
            return status, hit
        after = hit
    raise AssertionError(f"{tries} kills all came after their save's commit record")


def descendants(root: int) -> dict[int, str]:
    """pid -> comm of every live process below `root` (from /proc)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            parents[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[1]), comm)
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, (parent, comm) in parents.items():
            if parent == pid and child not in found:
                found[child] = comm
                frontier.append(child)
    return found


def kill_torch_rank(command: Callable[[], int], directory: Path, world_size: int, victim: str,
                    after: int = EVERY, timeout: float = 120.0) -> tuple[int, int | None]:
    """Run the torch command (`command()`: its argv run in this process, returning the exit
    status) in a thread and SIGKILL a rank at `victim`'s point of a save; returns (the exit
    status, the step whose save was hit, or None if none was)."""
    rank = world_size - 1 if victim == "rank" else 0
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(command()), daemon=True)
    thread.start()
    hit = _await_save(directory, _marker("torch", victim, world_size), after,
                      thread.is_alive, timeout)
    if hit is not None:
        pids = [pid for pid, comm in descendants(os.getpid()).items()
                if comm == f"mtrain-rank{rank}"]
        assert len(pids) == 1, f"rank {rank}: processes {pids}"
        os.kill(pids[0], signal.SIGKILL)
    thread.join(timeout)
    assert not thread.is_alive() and result, "the command did not end"
    return result[0], hit


def kill_process(impl: str, directory: Path, world_size: int, victim: str,
                 after: int = EVERY, timeout: float = 120.0,
                 options: tuple[str, ...] = OPTIONS) -> tuple[int, int | None, list[str]]:
    """Start the command (argv's, with `options`) as a process and SIGKILL it at `victim`'s
    point of a save (the reference), or SIGKILL the command itself (torch, victim
    "command"); returns (exit status, the step hit or None, the comms of processes left
    below it a moment later)."""
    marker = _marker(impl, victim, world_size)
    command = argv(impl, directory, world_size, options=options)
    proc = subprocess.Popen([sys.executable, "-m", "parity", *command],
                            cwd=ROOT, env=_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        hit = _await_save(directory, marker, after, lambda: proc.poll() is None, timeout)
        if hit is not None:  # stopped at once: reading /proc for its children takes ms,
            os.kill(proc.pid, signal.SIGSTOP)  # longer than the save's last steps
        below = list(descendants(proc.pid))
        if hit is not None:
            os.kill(proc.pid, signal.SIGKILL)
        status = proc.wait(timeout=60)
        left = _left(below)
        return status, hit, left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # what this test spawned ends here
            os.killpg(proc.pid, signal.SIGKILL)


def _left(pids: list[int], wait: float = 20.0) -> list[str]:
    """The comms of `pids` still alive (ranks end at their next step; waits up to `wait`)."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                alive.append(stat[stat.index("(") + 1:stat.rindex(")")])
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
