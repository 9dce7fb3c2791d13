"""`python -m parity COMMAND`: the command line, one module per command.

Each module of this package named in COMMANDS (a dash in a command's name is an
underscore in its module's) defines

    HELP = "one line for the command list"
    def add_arguments(p: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...      # the exit status

and is imported only when its command runs (so `--impl reference` never imports torch).

Exit statuses, the same for every command: EXIT_STATUSES below (the --help epilog and the
README's table are rendered from it).
A user error is raised as `UsageError("...")` anywhere below `run`; `main` prints it as one
line. Long work shows a progress bar (tqdm, on stderr) and ends with a line scripts can parse.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import math
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn, TextIO

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_FOUND, EXIT_INCOMPLETE, EXIT_UNKNOWN = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done: every claim held, nothing found"),
    (EXIT_FAILED, "a claim failed, a comparison mismatched, a test failed (a sweep or a fuzz "
                  "run that found a counterexample included)"),
    (EXIT_USAGE, "bad input: one line on stderr naming what was wrong and what is accepted "
                 "(argparse's own errors included; never a traceback); nothing changed on disk"),
    (EXIT_FOUND, "the command found what it looks for, a result and not an error: train "
                 "--check-numerics stopped at the first invalid value"),
    (EXIT_INCOMPLETE, "incomplete: the time budget ran out before all the work was reached "
                      "(fuzz: some target never ran); nothing that ran failed"),
    (EXIT_UNKNOWN, "unknown: the command cannot tell, and says why in one line (audit: the "
                   "files cannot settle whether the resume is exact); never a guess"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C), with one line saying so"),
    (EXIT_TERMINATED, "terminated (SIGTERM), handled like Ctrl-C: one line, and a checkpoint "
                      "being written is either whole or not there"),
)

# The commands, in the order `python -m parity --help` lists them; each is parity/lab/cli/<name>.py.
COMMANDS: tuple[str, ...] = ("report", "ranges", "sweep", "fuzz", "tolerances", "docs", "book",
                             "train", "replay", "account", "profile", "optimize", "miniproject",
                             "audit", "resume-check")


def find_users_modules() -> None:
    """Let the user's own module (`mytrain:make_trainer`, `mymodels:convnet`) be imported from
    the current folder: it goes at the end of sys.path, after the project's packages (NOTE
    [ A folder in the cwd shadows the project ] in parity/__main__.py took it off the front)."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def module_of(command: str) -> str:
    """The module of a command: parity/lab/cli/<name>.py, a dash in the name an underscore."""
    return f"parity.lab.cli.{command.replace('-', '_')}"


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is ONE line (no usage block) and exits with EXIT_USAGE."""

    _argv: tuple[str, ...] = ()

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = tuple(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {self._dash(message)} "
                              f"(see {self.prog} --help)\n")

    def _dash(self, message: str) -> str:
        """argparse reads `--sizes -3,4,5` as an option with no value ('expected one
        argument'); say what happened: the value starts with '-'."""
        found = re.fullmatch(r"argument (\S+): expected one argument", message)
        if found is None:
            return message
        names = found.group(1).split("/")
        at = next((i for i, a in enumerate(self._argv) if a in names), None)
        if at is None or at + 1 >= len(self._argv) or not re.match(r"-[\d.]",
                                                                   self._argv[at + 1]):
            return message  # a value forgotten before the next option: argparse says it
        value, option = self._argv[at + 1], self._argv[at]
        return (f"argument {option}: {value!r} starts with '-', so it reads as another option, "
                f"not as {option}'s value; write {option}={value} to pass it as the value")


# -- argument types: each raises argparse.ArgumentTypeError, which argparse prints as one line

def int_at_least(low: int) -> type:
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse  # type: ignore[return-value]


def finite_float(*, low: float = -math.inf, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False) -> type:
    """An argparse type: a finite float in the interval given (open or closed ends)."""
    lo = "(" if low_open or low == -math.inf else "["
    hi = ")" if high_open or high == math.inf else "]"
    interval = f"{lo}{low:g}, {high:g}{hi}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = (low < value if low_open else low <= value) and (
            value < high if high_open else value <= high)
        if not math.isfinite(value) or not inside:
            raise argparse.ArgumentTypeError(f"{text} is not a finite number in {interval}")
        return value

    parse.__name__ = f"number in {interval}"
    return parse  # type: ignore[return-value]


PROG = "python -m parity"  # how the README and the docs name the program


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """Every command's parser under the program name `prog` (the README's command reference
    is rendered with PROG; a run names the program as it was invoked: main's `prog`)."""
    parser = _Parser(prog=prog,
                     description="mirrortrain: every claim checked, sweeps, fuzzing, training.",
                     epilog="exit status: " + "; ".join(
                         f"{code} {meaning.split(':')[0].split(',')[0]}"
                         for code, meaning in EXIT_STATUSES))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    for name in COMMANDS:
        module = importlib.import_module(module_of(name))
        description = re.sub(r"python -m parity(?![.\w])", prog, module.__doc__ or "")
        p = sub.add_parser(name, help=module.HELP, description=description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, as Ctrl-C's KeyboardInterrupt is: whatever was
    being written is cleaned up by the same paths (ckpt.atomic removes its temporary file)."""


class _PipeSafe(io.TextIOBase):
    """stdout that, once its reader has gone (`... | head`), discards what is written instead
    of raising BrokenPipeError, so a training run piped into `head` trains on and checkpoints
    to the end, and nothing prints a traceback when the interpreter flushes at exit."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.closed_pipe = stream, False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.closed_pipe = True
        devnull = os.open(os.devnull, os.O_WRONLY)  # the stream's own fd: nothing left to
        os.dup2(devnull, self.stream.fileno())  # flush into a closed pipe at exit
        os.close(devnull)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


# NOTE [ The first signal ends the run ]
# Ctrl-C (SIGINT, which a terminal sends to the whole process group) and SIGTERM end a run
# with one line and 130 or 143. The first one counts: its handler ignores both signals from
# then on and raises (KeyboardInterrupt, or Terminated for SIGTERM) where the process is, so
# the cleanup that follows (a checkpoint's temporary file removed, a sweep's worker processes
# ended, the line printed) cannot be interrupted half-way by a second one, which would leave a
# traceback, or worker processes running until SIGKILL. When main runs the whole process
# (`exits`: parity/__main__.py's entry, which answers a signal that comes before main), the
# signals stay ignored until it exits; called from Python, main puts back the handlers it
# found. A signal the process was started ignoring (nohup, a background job) stays ignored.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _FirstSignal:
    """NOTE [ The first signal ends the run ], for a `with` block."""

    def __init__(self, exits: bool) -> None:
        self.exits, self.taken, self.previous = exits, False, {}
        self.signum: int | None = None  # the signal taken
        self.active = threading.current_thread() is threading.main_thread()

    def __enter__(self) -> _FirstSignal:
        if self.active:
            for s in SIGNALS:
                self.previous[s] = signal.getsignal(s)
                if self.previous[s] is not signal.SIG_IGN:
                    signal.signal(s, self._stop)
        return self

    def _stop(self, signum: int, frame: object) -> NoReturn:
        self.taken, self.signum = True, signum
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self.active and not (self.taken and self.exits):
            for s, handler in self.previous.items():
                signal.signal(s, handler)


# What a missing module means, by its top-level name: pyproject.toml's dependencies (pip's name
# of each), and its test extra, which `report` and `fuzz` run (tests/test_cli_environment.py
# holds both equal to pyproject.toml).
REQUIRED = {"numpy": "numpy", "torch": "torch", "ml_dtypes": "ml_dtypes", "tqdm": "tqdm",
            "xxhash": "xxhash"}
TEST_EXTRA = {"pytest": "pytest", "hypothesis": "hypothesis", "xdist": "pytest-xdist"}


def missing_dependency(e: ModuleNotFoundError) -> str | None:
    """The one line for a ModuleNotFoundError of a dependency this project declares (what is
    missing and the command that installs it), None for any other module (a real error)."""
    top = (e.name or "").split(".")[0]
    gone = f"{top} is not installed" if e.name == top else f"{e.name} is missing from {top}"
    if top in REQUIRED:
        return (f"{gone} (a required dependency); install it: pip install {REQUIRED[top]} "
                "(or reinstall this project: pip install -e . in a checkout)")
    if top in TEST_EXTRA:
        return (f"{gone}: this command runs the parity tests, which need the test extra; "
                'install it: pip install -e ".[test]" in a checkout, pip install '
                '"mirrortrain[test]" otherwise')
    return None


def require(*names: str) -> None:
    """Raise ModuleNotFoundError for the first of `names` that cannot be found (a command that
    runs them in a subprocess checks first, so the user gets missing_dependency's line)."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def main(argv: list[str] | None = None, prog: str = PROG, exits: bool = False) -> int:
    """Parse, run the command, and turn a UsageError into one line and exit status 2, Ctrl-C
    into one line and 130, SIGTERM into one line and 143 (NOTE [ The first signal ends the
    run ]), a missing dependency into one line and 2 (missing_dependency); a closed stdout
    pipe is not an error (_PipeSafe). `prog`: the program's name in every line and usage
    (entry passes how it was invoked); `exits`: the process ends when main returns."""
    stdout = sys.stdout
    words = sys.argv[1:] if argv is None else argv
    command = f" {words[0]}" if words and words[0] in COMMANDS else ""  # until it is parsed
    with _FirstSignal(exits) as first:
        try:
            args = build_parser(prog).parse_args(argv)
            args.prog = prog
            try:
                stdout.fileno()
                sys.stdout = _PipeSafe(stdout)  # type: ignore[assignment]
            except (AttributeError, OSError, ValueError):  # a captured stdout: no descriptor
                pass
            return args.run(args)
        except UsageError as e:
            print(f"{prog}{command}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except Terminated:
            print(f"{prog}{command}: terminated (SIGTERM)", file=sys.stderr)
            return EXIT_TERMINATED
        except KeyboardInterrupt:
            print(f"{prog}{command}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as e:
            # A signal's KeyboardInterrupt raised inside a C extension's import can come back
            # as another exception (NumPy's "multiarray failed to import"): the signal is what
            # happened, and it gets its own line and status.
            if first.signum is not None:
                terminated = first.signum == signal.SIGTERM
                print(f"{prog}{command}: " + ("terminated (SIGTERM)" if terminated
                                              else "interrupted"), file=sys.stderr)
                return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
            line = missing_dependency(e) if isinstance(e, ModuleNotFoundError) else None
            if line is None:
                raise
            print(f"{prog}{command}: error: {line}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            sys.stdout = stdout


def torch_device(text: str) -> Any:
    """The torch.device named by --device, or a UsageError saying what is accepted."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device; accepted: cpu, cuda, cuda:N"
                         ) from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {text!r}: this command runs on cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text!r}: torch.cuda.is_available() is False here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {text!r}: there are {torch.cuda.device_count()} CUDA "
                             "devices")
    return device


def pictures_skipped(args: argparse.Namespace) -> None:
    """Say on stderr, in one line, that the command drew no pictures because matplotlib (the
    optional extra `plot`) is not installed, and how to install it."""
    print(f"{getattr(args, 'prog', PROG)} {args.command}: pictures skipped: matplotlib is not "
          'installed (pip install -e ".[plot]" in a checkout, pip install "mirrortrain[plot]" '
          "otherwise)", file=sys.stderr)


OUTPUT_MARK = ".mirrortrain-output"  # names the command whose output a folder holds

# NOTE [ An output folder is the command's own ]
# A command writes its deliverables into --out under fixed names (postmortem.md, rubric.md,
# *.png, ...). Into a folder the user already keeps files in, that would replace a file of
# the same name without a word. So a command writes only into a folder that is missing, empty,
# or marked as a command's earlier output (OUTPUT_MARK, written when the folder is taken);
# a rerun into its own folder replaces what it wrote there, and anything else the folder
# holds is left alone. A non-empty folder without the mark is refused with a one-line error
# naming what is in it, before any work is done: nothing of the user's is ever overwritten.


def output_folder(text: str, option: str = "--out", command: str = "") -> Path:
    """A folder the command may write into: created if missing, refused (UsageError naming why)
    if it is not a folder, not writable, or holds files no command of this project wrote there
    (NOTE [ An output folder is the command's own ])."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {text}: exists and is not a folder")
    if path.is_dir() and not (path / OUTPUT_MARK).is_file():
        try:
            held = sorted(p.name for p in path.iterdir())
        except OSError as e:
            raise UsageError(f"{option} {text}: cannot read the folder ({e.strerror})") from None
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise UsageError(f"{option} {text}: the folder holds files this project did not "
                             f"write ({shown}); name a new or empty folder, so none of them "
                             "is overwritten")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {text}: cannot create the folder ({e.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {text}: the folder is not writable")
    mark = path / OUTPUT_MARK
    if not mark.is_file():
        mark.write_text(f"written by python -m parity {command}".rstrip() + "\n",
                        encoding="utf-8")
    return path
