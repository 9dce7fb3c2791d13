"""The command line under a closed pipe and SIGTERM, through the real `python -m parity`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """The commands these tests start take SIGINT as a terminal's ctrl-c: at its default.
    A test run started as a background job (`cmd &` in a script, nohup) inherits SIGINT
    ignored, its children too, and the command line rightly keeps an ignored SIGINT ignored
    (parity/__main__.py): every ctrl-c test would then wait out a whole sweep. So the test
    process takes SIGINT back for the test (children inherit it at its default on exec)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _piped_into_head(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """`python -m parity ARGS | head -1`: (the command's exit status, head's line, stderr)."""
    command = subprocess.Popen([sys.executable, "-m", "parity", *args], cwd=cwd, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-1"], stdin=command.stdout, capture_output=True,
                          text=True, timeout=120)
    command.stdout.close()  # type: ignore[union-attr]  # head has gone: the pipe is closed
    err = command.stderr.read().decode()  # type: ignore[union-attr]
    command.stderr.close()  # type: ignore[union-attr]
    return command.wait(timeout=120), head.stdout, err


def test_a_table_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    status, line, err = _piped_into_head(["tolerances"], tmp_path)
    assert (status, line) == (0, "# Claims and tolerances\n")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_training_run_piped_into_head_trains_and_checkpoints_to_the_end(tmp_path: Path
                                                                           ) -> None:
    """The reader going away loses the output, not the run: the last checkpoint is written."""
    run = tmp_path / "run"
    status, line, err = _piped_into_head(
        ["train", "--impl", "reference", "--steps", "40", "--checkpoint-dir", str(run),
         "--checkpoint-every", "10"], tmp_path)
    assert status == 0 and line.startswith("step 1 "), (status, line, err)
    assert "Traceback" not in err, err
    assert (run / "ckpt-00000040.ckpt").is_file(), sorted(p.name for p in run.iterdir())


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is POSIX")
def test_sigterm_during_training_is_one_line_exit_143_and_the_run_resumes(tmp_path: Path
                                                                           ) -> None:
    run = tmp_path / "run"
    args = ["train", "--impl", "reference", "--steps", "100000", "--horizon", "100000",
            "--checkpoint-dir", str(run), "--checkpoint-every", "1"]
    p = subprocess.Popen([sys.executable, "-m", "parity", *args], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:  # type: ignore[union-attr]
            if line.startswith("step 5 "):
                break
        time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    lines = err.strip().splitlines()
    assert lines == ["python -m parity train: terminated (SIGTERM)"], err
    assert not [q.name for q in run.iterdir() if not q.name.startswith("ckpt-")], (
        "a temporary file was left behind")
    newest = max(int(q.name[5:13]) for q in run.iterdir())  # ckpt-00000012.ckpt
    resumed = subprocess.run([sys.executable, "-m", "parity", *args[:3], "--steps",
                              str(newest + 2), *args[5:9], "--resume"],
                             cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from ckpt-{newest:08d}.ckpt at step {newest}" in resumed.stdout + (
        resumed.stderr)
    assert "state-sha256:" in resumed.stdout


# -- a sweep stops on the first signal: its workers ended, one line, 130 or 143

STOPPED_WITHIN_S = 2.0  # measured ~0.1 s; the workers' own run to the end took ~68 s


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`, each with its start time (/proc/PID/stat field 22),
    which tells a pid reused later from the child itself."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(pid) and fields[0] != "Z":
                found[int(entry.name)] = fields[19]
    return found


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict (SigIgn: the ignored signals, a hex mask)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _alive(pid: int, started: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[19] == started and fields[0] != "Z"


def _stop_a_sweep(signals: list[tuple[signal.Signals, bool]], tmp_path: Path
                  ) -> tuple[int, str, str, float, list[int]]:
    """Start `python -m parity sweep float16 --exhaustive` in its own process group, wait until
    its two workers are at work (its progress bar on stderr), send each of `signals` (to the
    group when its flag says so, as a terminal sends Ctrl-C; else to the process), the second
    while the first is being handled. Returns (exit status, stderr before the first signal,
    stderr after, seconds from the first signal to the exit, the workers still alive)."""
    p = subprocess.Popen([sys.executable, "-m", "parity", "sweep", "float16", "--exhaustive"],
                         cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        before, deadline = b"", time.monotonic() + 120
        os.set_blocking(p.stderr.fileno(), False)  # type: ignore[union-attr]
        workers: dict[int, str] = {}
        while b"%|" not in before or len(workers) < 2:  # the bar is drawn, the workers forked
            assert time.monotonic() < deadline and p.poll() is None, before.decode()
            time.sleep(0.05)
            before += p.stderr.read() or b""  # type: ignore[union-attr]
            workers = _children(p.pid)
        time.sleep(0.3)  # chunks in flight in both workers
        for pid in workers:  # they ignore SIGINT: a terminal's Ctrl-C is the parent's to answer
            assert int(_status(pid)["SigIgn"], 16) & 1 << (signal.SIGINT - 1), pid
        before += p.stderr.read() or b""  # type: ignore[union-attr]
        began = time.monotonic()
        for i, (sig, group) in enumerate(signals):
            if i:
                time.sleep(0.02)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig) if group else p.send_signal(sig)
        status = p.wait(timeout=60)
        seconds = time.monotonic() - began
        os.set_blocking(p.stderr.fileno(), True)  # type: ignore[union-attr]
        after = p.stderr.read()  # type: ignore[union-attr]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.stderr.close()  # type: ignore[union-attr]
    time.sleep(0.1)  # a worker the parent did not end would still be here
    left = [pid for pid, started in workers.items() if _alive(pid, started)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return status, before.decode(), after.decode(), seconds, left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists processes in /proc")
@pytest.mark.parametrize(("signals", "status", "line"), [
    ([(signal.SIGINT, True)], 130, "interrupted"),
    ([(signal.SIGINT, True), (signal.SIGINT, True)], 130, "interrupted"),
    ([(signal.SIGTERM, False), (signal.SIGTERM, False)], 143, "terminated (SIGTERM)"),
    ([(signal.SIGTERM, True), (signal.SIGINT, True)], 143, "terminated (SIGTERM)"),
], ids=["ctrl-c", "ctrl-c-twice", "sigterm-twice", "group-sigterm-then-ctrl-c"])
def test_a_sweep_stops_at_once_on_the_first_signal_and_ends_its_workers(
        signals: list[tuple[signal.Signals, bool]], status: int, line: str,
        tmp_path: Path) -> None:
    """The first signal decides (a second changes nothing): within a second or so, no worker
    left, one line on stderr after the bar (erased, its carriage returns only) and no
    traceback from the parent or the workers."""
    got, before, after, seconds, left = _stop_a_sweep(signals, tmp_path)
    assert (got, left) == (status, []), (got, left, after)
    assert seconds < STOPPED_WITHIN_S, seconds
    assert "Traceback" not in before + after and "KeyboardInterrupt" not in after, after
    assert after.count("\n") == 1, after
    assert (before + after).rsplit("\r", 1)[-1] == f"python -m parity sweep: {line}\n", after


# -- a signal while the command is still importing (torch: a second or more)

def _mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
@pytest.mark.parametrize("library", ["_multiarray_umath", "libtorch"])
@pytest.mark.parametrize(("sig", "status", "line"), [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_while_the_command_imports_is_one_line(library: str, sig: signal.Signals,
                                                        status: int, line: str,
                                                        tmp_path: Path) -> None:
    """Sent as soon as `library` is mapped into the process: inside NumPy's import (while the
    parser is built: the sweep's choices come from parity.oracles) or torch's (as the command
    runs): the command's one line and its status, no traceback, nothing written."""
    p = subprocess.Popen([sys.executable, "-m", "parity", "train", "--impl", "torch",
                          "--steps", "1", "--checkpoint-dir", str(tmp_path / "run")],
                         cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + 60
        while not _mapped(p.pid, library):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.002)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert (p.returncode, err, out) == (status, f"python -m parity train: {line}\n", "")
    assert not (tmp_path / "run").exists()


# -- the first signal decides: before the command line has taken over, and during a cleanup

BEFORE_MAIN = """import sys, time
class Slow:  # importing the command line takes a while: the moment to be interrupted
    def find_spec(self, name, path=None, target=None):
        if name == "parity.lab.cli":
            print("importing", flush=True)
            time.sleep(60)
sys.meta_path.insert(0, Slow())
sys.argv = ["__main__.py", "tolerances"]
from parity.__main__ import entry
sys.exit(entry())
"""

SIGNAL_IN_CLEANUP = """import os, signal, sys, time
import parity.lab.cli.tolerances as command
def run(args):
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal: raised here at once
        time.sleep(60)
    finally:  # the command's cleanup, during which a second signal comes
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
command.run = run
sys.argv = ["__main__.py", "tolerances"]
from parity.__main__ import entry
sys.exit(entry())
"""


@pytest.mark.parametrize(("sig", "status", "line"), [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_before_the_command_line_has_loaded_is_one_line(
        sig: signal.Signals, status: int, line: str, tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", BEFORE_MAIN], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "importing\n"  # type: ignore[union-attr]
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert (p.returncode, err) == (status, f"python -m parity tolerances: {line}\n")


def test_a_second_signal_during_the_cleanup_changes_nothing(tmp_path: Path) -> None:
    """SIGTERM, then SIGINT while the command cleans up: still SIGTERM's one line and 143."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_IN_CLEANUP], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (
        143, "python -m parity tolerances: terminated (SIGTERM)\n")
