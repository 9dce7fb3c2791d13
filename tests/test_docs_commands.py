"""Every `python -m parity` command that README.md and docs/*.md show works as its page says.

A command is a line of a fenced block (```bash, ```console, ```text or a bare ```) or of an
indented one that starts with `python -m parity` or `$ python -m parity`, outside the
generated parts (those are rendered from the parser itself: parity/lab/gendocs); a trailing
backslash continues it, `#` starts a comment. Each one is

- parsed by the command line's own parser (`parity.lab.cli.build_parser`) in an empty folder:
  a wrong option, a missing required argument or a bad value fails here, whatever the
  command costs to run. A synopsis (a line with placeholders: `[--x]`, `{a,b}`, `a|b`, `DIR`,
  `...`) is held to its command's and options' names only;
- run as a reader runs it, unless listed in SLOW (run behind `-m slow`) or NOT_RUN (with the
  reason): `python -m parity ...` (the command line's main in the test's process; SLOW's
  as processes of their own, the project on PYTHONPATH), each page's commands in order in
  one temporary folder (a page's later commands read what its earlier ones wrote).
  The exit status must be the one the page implies: 3 for a `--check-numerics` run with a
  seeded fault (numerics.md: "Exit status 3 means found"; README: "exit 3") and for the
  replay of its file (numerics.md: "it named a node"), 0 otherwise.
  In a ```console block, every line shown under a `$` command (but `...`) is a line the
  command printed.

Commands written inline in prose (`python -m parity ...` in backticks) mention a command more
often than they give one to run; their command and option names must exist.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from parity.lab.cli import COMMANDS, EXIT_FOUND, EXIT_OK, build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PREFIX = "python -m parity"
SHELL = {"", "bash", "console", "sh", "shell", "text"}  # the fenced blocks commands are read in
TIMEOUT = 600  # seconds for one command: the slowest listed below takes under a minute

# Runnable, but too long for the default suite (measured on 2 busy cores).
SLOW: dict[str, str] = {
    "python -m parity train --impl torch --model gpt --steps 6 --checkpoint-dir run-gpt "
    "--precision fp16 --check-numerics --fault attention_overflow":
        "the README's fault example with another folder, which runs by default",
    "python -m parity account --model mlp --measure": "both trees' step measured: ~3 s",
    "python -m parity account --model mlp --precision bf16 --recompute sqrt --dropout 0.1 "
    "--measure": "both trees' step measured: ~3 s",
    "python -m parity account --model gpt --n-layer 2 --d-model 32 --n-head 2 --seq-len 16 "
    "--vocab 12 --batch 4 --precision bf16 --recompute full_early_stop --measure":
        "both trees' transformer step measured: ~3 s",
    "python -m parity train --impl torch --world-size 2 --steps 100 --checkpoint-dir runs/d2":
        "two gloo processes: ~6 s",
    "python -m parity train --impl torch --world-size 2 --steps 200 --checkpoint-dir runs/d2 "
    "--resume": "two gloo processes: ~6 s",
    "python -m parity train --impl torch --world-size 3 --steps 200 --checkpoint-dir runs/d2 "
    "--resume": "three gloo processes: ~7 s",
    "python -m parity train --impl torch --world-size 2 --steps 1 --checkpoint-dir runs/t1":
        "two gloo processes: ~6 s",
    "python -m parity train --impl torch --world-size 2 --model gpt --parallel fsdp --steps 100 "
    "--horizon 200 --checkpoint-dir runs/f2": "100 FSDP2 steps of the GPT on two gloo ranks: ~9 s",
    "python -m parity train --impl torch --world-size 3 --model gpt --parallel fsdp --steps 200 "
    "--checkpoint-dir runs/f2 --resume": "100 FSDP2 steps of the GPT on three gloo ranks: ~12 s",
    "python -m parity profile --impl torch": "a profiled run with its pictures: ~5 s",
    "python -m parity profile --impl reference": "a profiled run with its pictures: ~3 s",
    "python -m parity profile --impl reference --model gpt --precision bf16 --recompute sqrt":
        "the transformer profiled in NumPy: ~8 s",
    "python -m parity profile --impl torch --steps 40 --wait 2 --warmup 3 --active 10 "
    "--out runs/p1": "40 profiled steps: ~5 s",
    "python -m parity train --impl reference --model gpt --steps 200 --checkpoint-dir runs/gpt "
    "--precision fp16 --dropout 0.1 --recompute optimal:2+selective":
        "200 steps of the transformer in NumPy: ~10 s",
    "python -m parity train --impl torch --steps 12 --checkpoint-dir common --resume "
    "--check-numerics --fault log_of_zero": "a torch run (~3 s) beside the two by default",
    "python -m parity train --impl torch --steps 20 --checkpoint-dir w0 --loader-workers 0":
        "20 torch steps: ~4 s",
    "python -m parity train --impl torch --steps 20 --checkpoint-dir w2 --loader-workers 2":
        "two DataLoader worker processes: ~5 s",
}

# Never run here: parsed only.
NOT_RUN: dict[str, str] = {
    "python -m parity fuzz --seconds 600": "a 600-s time budget by design (tests/test_fuzz.py "
                                           "runs the command on a short one)",
    "python -m parity profile --impl torch --device cuda --precision bf16 --recompute sqrt":
        "needs a CUDA device",
    "python -m parity audit out/ckpt.pt": "the reader's own nanoGPT checkpoint",
    "python -m parity audit output/checkpoint_3": "the reader's own Accelerate folder",
    "python -m parity audit output/checkpoint-500": "the reader's own Trainer folder "
                                                    "(tests/test_audit_hf.py writes one)",
    "python -m parity audit model.safetensors": "the reader's own weights file "
                                                "(tests/test_audit.py writes one)",
    "python -m parity audit runs/a --json": "the reader's own run folder",
    "python -m parity audit runs/ddp": "the reader's own --world-size run folder",
    "python -m parity resume-check mytrain:make_trainer --steps 8 --at 4":
        "the reader's own module, mytrain (tests/test_resume_check.py runs the command)",
}

# numerics.md: the one catalogued fault that makes no non-finite value (the run exits 0)
FINITE_FAULTS = frozenset({"fp16_without_scaler"})


@dataclass(frozen=True)
class Command:
    """One `python -m parity` command a page shows."""

    page: str
    line: int  # 1-based, where it starts
    text: str  # the command as a reader types it: `$ ` and a trailing comment dropped
    shown: tuple[str, ...] = ()  # the output lines a ```console block shows under it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)[len(PREFIX.split()):]

    @property
    def synopsis(self) -> bool:
        """A line of placeholders (`--out DIR [--repeats R]`), not a command to run."""
        return any(re.search(r"[\[\]{}|<>]|\.\.\.", t) or re.fullmatch(r"[A-Z][A-Z0-9_,.:]*", t)
                   for t in self.argv)


def _normal(text: str) -> str:
    """`text` without `$ `, its comment and its line breaks: one space between words."""
    text = re.sub(r"^\$\s+", "", text.strip())
    try:
        return " ".join(shlex.split(text, comments=True))
    except ValueError:  # an unbalanced quote: keep the words as written
        return " ".join(text.split())


def _outside_generated(lines: list[str]) -> list[tuple[int, str]]:
    """(1-based number, line) of the hand-written lines (not between generated markers)."""
    kept, generated = [], False
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("<!-- generated:"):
            generated = True
        elif line.strip().startswith("<!-- end generated:"):
            generated = False
        elif not generated:
            kept.append((number, line))
    return kept


def fenced_commands(page: Path) -> list[Command]:
    """The commands of `page`'s fenced shell blocks, in page order (module docstring)."""
    lines = _outside_generated(page.read_text(encoding="utf-8").splitlines())
    found: list[Command] = []
    fence: str | None = None  # the open block's language
    i = 0
    while i < len(lines):
        number, line = lines[i]
        stripped = line.strip()
        i += 1
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            continue
        indented = fence is None and line.startswith("    ")  # an indented code block
        if not (fence in SHELL or indented) or not re.match(r"(\$\s+)?python -m parity\b",
                                                             stripped):
            continue
        text = stripped
        while text.endswith("\\") or (i < len(lines) and lines[i][1][:1].isspace()
                                      and lines[i][1].strip().startswith("[")):
            text = text.rstrip("\\") + " " + lines[i][1].strip()  # a continued line
            i += 1
        shown: list[str] = []
        if fence == "console":
            while i < len(lines) and not lines[i][1].strip().startswith(("$", "```")):
                out = lines[i][1].rstrip()
                if out.strip() and out.strip() != "...":
                    shown.append(out)
                i += 1
        found.append(Command(page.name, number, _normal(text), tuple(shown)))
    return found


def inline_commands(page: Path) -> list[Command]:
    """The `python -m parity ...` code spans of `page`'s prose, generated parts included."""
    text = page.read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [Command(page.name, prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
            for m in re.finditer(r"`(python -m parity\b[^`]*)`", prose)]


FENCED = [c for page in PAGES for c in fenced_commands(page)]
INLINE = [c for page in PAGES for c in inline_commands(page)]


def runnable(command: Command) -> bool:
    return not command.synopsis and command.text not in NOT_RUN


def expected_status(command: Command) -> int:
    """3 for a --check-numerics run with a seeded fault that makes a non-finite value (the
    detector stops there: "found") and for a replay of its file (it names the node,
    numerics.md), 0 otherwise."""
    argv = command.argv
    if argv[0] == "replay":
        return EXIT_FOUND
    if "--check-numerics" in argv and "--fault" in argv:
        return EXIT_OK if argv[argv.index("--fault") + 1] in FINITE_FAULTS else EXIT_FOUND
    return EXIT_OK


@functools.cache
def parser() -> argparse.ArgumentParser:
    return build_parser()


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, as build_parser() builds it (argparse keeps them in the
    subparsers action: no public accessor)."""
    [action] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def name_problems(command: Command, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What in `command` names no command or option of the parser (its placeholders aside)."""
    argv = command.argv
    if not argv or not re.fullmatch(r"[a-z][a-z-]*", argv[0]):
        return []  # `python -m parity COMMAND`, `<command>`: a placeholder
    if argv[0] not in parsers:
        return [f"{command.where}: no command {argv[0]!r} (the commands: {', '.join(COMMANDS)})"]
    options = {s for a in parsers[argv[0]]._actions for s in a.option_strings}
    named = {m.split("=")[0] for word in argv[1:] for m in re.findall(r"--[a-z][\w-]*", word)}
    return [f"{command.where}: {argv[0]} has no option {o}" for o in sorted(named - options)]


def parse_problem(command: Command) -> str | None:
    """argparse's one line about `command`, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser().parse_args(command.argv)
    except SystemExit as e:
        if e.code != 0:  # `--fault list` prints the catalogue and exits 0
            return f"{command.where}: {err.getvalue().strip() or f'exit {e.code}'}"
    return None


def run(command: Command, cwd: Path) -> list[str]:
    """Run `command` in `cwd` as a reader would; what is wrong with its outcome. The quick
    commands run through the command line's own main in this process (`python -m parity`
    is that main: a process each paid its imports, ~2 s, for nothing the page promises);
    the slow ones as a process of their own, the reader's way to the letter."""
    if command.text not in SLOW:
        done = _in_process(command, cwd)
    else:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH"))
                                            if p)
        env.setdefault("OMP_NUM_THREADS", "1")  # the suite's processes share the cores
        done = subprocess.run([sys.executable, "-m", "parity", *command.argv], cwd=cwd,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=TIMEOUT)
    problems = []
    want = expected_status(command)
    if done.returncode != want:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        problems.append(f"{command.where}: `{command.text}` exited {done.returncode}, the "
                        f"page implies {want}: " + " | ".join(tail))
    printed = {line.strip() for line in done.stdout.splitlines() + done.stderr.splitlines()}
    problems += [f"{command.where}: `{command.text}` did not print the line the page shows: "
                 f"{line.strip()}" for line in command.shown if line.strip() not in printed]
    return problems


def _in_process(command: Command, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m parity ARGV` in `cwd` through parity.lab.cli.main, its outcome as a
    process's would read."""
    from parity.lab.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(command.argv))
            except SystemExit as e:  # argparse's --help and usage errors
                status = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(command.argv, status, out.getvalue(), err.getvalue())


def run_page(page: str, commands: list[Command], tmp_path: Path) -> None:
    problems = [p for c in commands for p in run(c, tmp_path)]
    assert not problems, f"{page}: " + "\n".join(problems)


def _by_page(keep: bool | None) -> list[tuple[str, list[Command]]]:
    """(page, its runnable commands in order): keep None: all of them; True: pages with a
    command outside SLOW, those commands; False: pages with a SLOW command, all of them."""
    pages: dict[str, list[Command]] = {}
    for c in FENCED:
        if runnable(c):
            pages.setdefault(c.page, []).append(c)
    if keep is True:
        pages = {p: [c for c in cs if c.text not in SLOW] for p, cs in pages.items()}
    elif keep is False:
        pages = {p: cs for p, cs in pages.items() if any(c.text in SLOW for c in cs)}
    return [(p, cs) for p, cs in pages.items() if cs]


def test_the_pages_show_commands_to_read() -> None:
    """The reading itself: commands on the README and the pages, a console block's output
    lines, inline mentions (an extractor that finds nothing makes every test here vacuous)."""
    assert {"README.md", "numerics.md", "distributed.md"} <= {c.page for c in FENCED}
    assert any(c.shown for c in FENCED) and any(c.synopsis for c in FENCED)
    assert len(INLINE) > len(FENCED) > 20


def test_every_listed_command_is_one_a_page_shows() -> None:
    """SLOW and NOT_RUN name commands the pages show now (an edited command is not left
    listed under its old text), and none is in both."""
    shown = {c.text for c in FENCED}
    assert not (set(SLOW) & set(NOT_RUN))
    assert sorted(set(SLOW) - shown) == [] and sorted(set(NOT_RUN) - shown) == []


@pytest.mark.parametrize("command", FENCED, ids=[c.where for c in FENCED])
def test_every_command_a_page_shows_parses(command: Command, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's parser takes the command whole (required arguments, option names,
    values); a synopsis's command and option names exist."""
    monkeypatch.chdir(tmp_path)  # a --checkpoint-dir is checked against the folder
    if command.synopsis:
        assert name_problems(command, subparsers()) == []
    else:
        assert parse_problem(command) is None


def test_every_inline_command_names_real_options() -> None:
    """A command mentioned in prose names a command and options that exist."""
    parsers = subparsers()
    assert [p for c in INLINE for p in name_problems(c, parsers)] == []


@pytest.mark.parametrize(("page", "commands"), _by_page(keep=True),
                         ids=[p for p, _ in _by_page(keep=True)])
def test_the_quick_commands_of_a_page_run_as_it_says(page: str, commands: list[Command],
                                                     tmp_path: Path) -> None:
    """The page's commands outside SLOW and NOT_RUN, in order in one folder: the exit status
    the page implies, the output lines it shows."""
    run_page(page, commands, tmp_path)


@pytest.mark.slow  # SLOW's commands, with the rest of their page (its earlier commands first)
@pytest.mark.parametrize(("page", "commands"), _by_page(keep=False),
                         ids=[p for p, _ in _by_page(keep=False)])
def test_every_command_of_a_page_runs_as_it_says(page: str, commands: list[Command],
                                                 tmp_path: Path) -> None:
    """Every runnable command of the page, in order in one folder, as the quick test holds
    them."""
    run_page(page, commands, tmp_path)
