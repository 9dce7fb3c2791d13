"""The two floors of parity/: the proof (claims, drivers, compare, strategies, the parity
tests) below, the lab (parity/lab/: command line, runners, report, docs generation,
pictures) on top. Arrows run down only: lab -> proof -> torch_impl -> reference.

Read from the source with `ast`, function-level imports included, so a lazy import cannot
hide an arrow pointing up. The parity tests (parity/test_*.py) sit above both floors: a
claim about a whole command (kill a training process, resume, compare digests) runs the
command, so a test may import the lab; nothing the tests import from the proof may.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARITY = ROOT / "parity"
LAB = PARITY / "lab"


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at any depth, with `from m import n` also
    counted as m.n (so `from parity import lab` is seen)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def proof_sources() -> list[Path]:
    """Every module of the proof: parity/ less the lab, the tests and the entry point."""
    return sorted(p for p in PARITY.rglob("*.py")
                  if LAB not in p.parents and not p.name.startswith("test_")
                  and p.name != "__main__.py")


def is_lab(name: str) -> bool:
    return name == "parity.lab" or name.startswith("parity.lab.")


@pytest.mark.parametrize("path", proof_sources(), ids=lambda p: str(p.relative_to(PARITY)))
def test_the_proof_never_imports_the_lab(path: Path) -> None:
    up = sorted(m for m in imported_modules(path) if is_lab(m))
    assert not up, f"{path.relative_to(ROOT)} imports the lab: {up}"


def test_every_driver_runs_a_tree_and_nothing_else_is_in_drivers() -> None:
    """A driver runs the trees on an input: it imports reference, torch_impl or torch. A
    module importing none of them is not a driver (a bound belongs in parity/claims/, a
    page or a picture in the lab)."""
    trees = ("reference", "torch_impl", "torch")
    not_drivers = []
    for path in sorted((PARITY / "drivers").glob("*.py")):
        if path.name == "__init__.py":
            continue
        if not any(m.split(".")[0] in trees for m in imported_modules(path)):
            not_drivers.append(path.name)
    assert not not_drivers, f"parity/drivers/ holds modules that run no tree: {not_drivers}"


def _graph() -> dict[str, set[str]]:
    paths = sorted(PARITY.rglob("*.py"))
    names = {module_name(p) for p in paths}
    return {module_name(p): {m for m in imported_modules(p) if m in names} - {module_name(p)}
            for p in paths}


def test_parity_has_no_import_cycle() -> None:
    """No module of parity/ (proof or lab) reaches itself through its imports; a package
    importing its own submodules (parity.lab.cli -> parity.lab.cli.train -> parity.lab.cli)
    is the one kind of loop Python resolves by design, and counted only when the submodule
    imports a name the package defines after importing it (none here: reported as a cycle)."""
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(v: str) -> None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                cycles.append([*stack[stack.index(w):], w])
            elif w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v)
    loops = [c for c in cycles if not all(b.startswith(a + ".") or a.startswith(b + ".")
                                          for a, b in itertools.pairwise(c))]
    assert not loops, "import cycles: " + "; ".join(" -> ".join(c) for c in loops)
