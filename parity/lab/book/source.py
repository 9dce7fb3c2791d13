"""What the book shows of the code: the source and docstring of each side of a manifest row,
the NOTE blocks of a module, and the source of a test, each read from the checkout.

A side is "module:qualname" (NOTE [ Twin manifests ] in parity/claims/__init__.py), shown as
the statement that defines it in that module's file, found with `ast` (each file parsed once):
for a class or function, exactly the lines `inspect.getsource` returns (decorators included);
for a name bound by an assignment (a constant, a type alias, `GradScaler =
torch.amp.GradScaler`), which has no source of its own for inspect (or the library's, which is
not what the module says), that assignment. The comment lines directly above belong to it, and
the object's own docstring is taken out of the code to be read as prose beside it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.claims import Manifest

ROOT = Path(__file__).resolve().parents[3]  # the checkout holding parity/
NOTE_HEAD = re.compile(r"# NOTE \[ (.+?) \]\s*$")


@dataclass(frozen=True)
class Side:
    """One side of a manifest row as the page shows it."""

    qualname: str
    where: str  # "reference/loss_scaling.py:47": where the code shown begins
    span: tuple[int, int]  # the first and last line of the statement itself (decorators in)
    doc: str  # the object's docstring (prose), or ""
    code: str  # its source without the docstring


@dataclass(frozen=True)
class Alias:
    """A torch object the row's torch side IS: its dotted name and its docs line."""

    name: str
    line: str


@dataclass(frozen=True)
class Note:
    """A `# NOTE [ Name ]` comment block at a module's top level."""

    name: str
    where: str
    line: int  # the header's line in its file
    text: str  # the block's lines without the comment marks


def module_file(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


@functools.cache
def _lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8").splitlines())


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def resolve(dotted: str) -> Any:
    """The object named "module:qualname", or by a dotted path whose longest importable
    prefix is the module ("torch.amp.GradScaler")."""
    if ":" in dotted:
        module, qualname = dotted.split(":")
        obj = importlib.import_module(module)
    else:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            qualname = ".".join(parts[cut:])
            break
        else:
            raise ImportError(f"nothing of {dotted} can be imported")
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def docs_line(obj: Any) -> str:
    """The first line of an object's docstring ("" where it has none)."""
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    targets = node.targets if isinstance(node, ast.Assign) else (
        [node.target] if isinstance(node, ast.AnnAssign) else [])
    return any(isinstance(n, ast.Name) and n.id == name
               for t in targets for n in ast.walk(t))


def _find(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The first statement of `body` (under an `if` or `try` too) that binds `name`."""
    for node in body:
        if _binds(node, name):
            return node
        if isinstance(node, (ast.If, ast.Try)):
            for inner in (node.body, *(h.body for h in getattr(node, "handlers", ())),
                          node.orelse, getattr(node, "finalbody", [])):
                found = _find(inner, name)
                if found is not None:
                    return found
    return None


def _statement(path: Path, qualname: str) -> ast.stmt:
    body: list[ast.stmt] = _tree(path).body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        node = _find(body, part)
        if node is None:
            raise LookupError(f"{rel(path)} binds no {qualname}")
        body = getattr(node, "body", [])
    assert node is not None
    return node


def _first_line(node: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _comments_above(path: Path, first: int) -> int:
    """The line (1-based) where the comment lines directly above line `first` begin."""
    lines = _lines(path)
    while first > 1 and lines[first - 2].lstrip().startswith("#") and \
            not NOTE_HEAD.search(lines[first - 2]):
        first -= 1
    return first


def _docstring(node: ast.stmt) -> ast.Expr | None:
    """A def's or class's docstring statement, where it starts on a line of its own."""
    body = getattr(node, "body", None) if not isinstance(node, (ast.Assign, ast.AnnAssign)) \
        else None
    if not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    if not isinstance(value, ast.Constant) or not isinstance(value.value, str) or \
            body[0].lineno == node.lineno:
        return None
    return body[0]


def side(spec: str) -> Side:
    """The source and docstring of "module:qualname": its statement in its module's file (for
    a class or function, the lines inspect.getsource gives; tests/test_book.py holds the two
    equal), the comment lines directly above it, its own docstring taken out as prose."""
    module, qualname = spec.split(":")
    path = module_file(module)
    node = _statement(path, qualname)
    first, last = _first_line(node), node.end_lineno or node.lineno
    top = _comments_above(path, first)
    lines = list(_lines(path)[top - 1:last])
    doc = ""
    ds = _docstring(node)
    if ds is not None:
        begin, end = ds.lineno - top, (ds.end_lineno or ds.lineno) - top + 1
        if end < len(lines) and not lines[end].strip():  # the blank line after it
            end += 1
        lines[begin:end] = [" " * ds.col_offset + "..."] if len(node.body) == 1 else []
        doc = inspect.cleandoc(ds.value.value)  # type: ignore[attr-defined]
    return Side(qualname, f"{rel(path)}:{top}", (first, last), doc,
                textwrap.dedent("\n".join(lines)).rstrip())


def module_doc(module: str) -> str:
    """A module's docstring, cleaned ("" where it has none)."""
    return inspect.cleandoc(ast.get_docstring(_tree(module_file(module)), clean=False) or "")


def notes(module: str) -> list[Note]:
    """The NOTE blocks at the top level of a module's file, in file order: a comment line
    `# NOTE [ Name ]` at column 0 and the comment lines that follow it."""
    path = module_file(module)
    lines = _lines(path)
    found = []
    for i, line in enumerate(lines):
        head = NOTE_HEAD.match(line)
        if head is None:
            continue
        body = []
        for follow in lines[i + 1:]:
            if not follow.startswith("#"):
                break
            body.append(follow[2:] if follow.startswith("# ") else follow[1:])
        found.append(Note(head.group(1), f"{rel(path)}:{i + 1}", i + 1, "\n".join(body)))
    return found


def top_level_lines(module: str) -> dict[str, int]:
    """Each top-level name a module binds (under an `if` or `try` too) -> its first line."""
    out: dict[str, int] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            first = _first_line(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(node.name, first)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, first)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for h in getattr(node, "handlers", ()):
                    visit(h.body)
                visit(node.orelse)
                visit(getattr(node, "finalbody", []))

    visit(_tree(module_file(module)).body)
    return out


def test_source(nodeid: str) -> tuple[str, str] | None:
    """(where, source) of the test function a pytest node id names (its parameters dropped),
    None where the file no longer defines it."""
    name = nodeid.split("[", 1)[0]
    file, *qualname = name.split("::")
    path = ROOT / file
    if not path.is_file() or not qualname:
        return None
    try:
        node = _statement(path, ".".join(qualname))
    except LookupError:
        return None
    first = _first_line(node)
    return (f"{file}:{first}",
            textwrap.dedent("\n".join(_lines(path)[first - 1:node.end_lineno])))


def page_module(m: Manifest) -> str:
    """The module whose docstring introduces the topic: reference.<topic> where the topic
    has it, else its first reference module, else its first module."""
    if f"reference.{m.topic}" in m.modules:
        return f"reference.{m.topic}"
    return next((mod for mod in m.modules if mod.startswith("reference.")), m.modules[0])
