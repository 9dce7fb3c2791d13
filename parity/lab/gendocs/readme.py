"""The README's command reference and exit statuses, rendered from the parsers themselves
(parity/lab/cli/), so the text a user reads is what `python -m parity COMMAND --help` says."""

from __future__ import annotations

import argparse
import textwrap

from parity.lab.gendocs import section

WIDTH = 92
README = "../README.md"  # a page name is relative to docs/


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from parity.lab.cli import COMMANDS, build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: action.choices[name] for name in COMMANDS}


def _usage(p: argparse.ArgumentParser) -> str:
    """The command's usage line as argparse writes it, wrapped at WIDTH (continuations
    indented by four)."""
    text = " ".join(p.format_usage().removeprefix("usage: ").replace(" [-h]", "").split())
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="    ",
                                   break_on_hyphens=False, break_long_words=False))


@section(README, "commands")
def _() -> str:
    import importlib

    from parity.lab.cli import COMMANDS, module_of

    blocks = []
    for name, p in _subparsers().items():
        helptext = importlib.import_module(module_of(name)).HELP
        blocks.append(_usage(p) + "\n" + textwrap.indent(
            textwrap.fill(helptext, WIDTH - 31), " " * 31))
    assert len(blocks) == len(COMMANDS)
    return "```\n" + "\n".join(blocks) + "\n```"


@section(README, "exit-statuses")
def _() -> str:
    from parity.lab.cli import EXIT_STATUSES

    rows = "\n".join(f"| {code} | {meaning} |" for code, meaning in EXIT_STATUSES)
    return ("| exit status | meaning |\n|---|---|\n" + rows)
