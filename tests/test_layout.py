"""The import direction docs/layout.md draws:
lab -> parity (proof) -> torch_impl -> reference -> common, ckpt (and torch_impl -> common, ckpt);
ranks/ (the process launcher) beside them, imported by torch_impl and parity, importing none.

Read from the source with `ast` (no import runs), plus subprocesses proving the transitive
rules: importing every reference module leaves torch unimported, every torch_impl module
loads no reference module, every common module loads neither torch nor reference.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = sys.stdlib_module_names


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at any depth (function-level imports too),
    `from m import n` counted as m and m.n (so `from parity import lab` is seen)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).glob("*.py"))
    assert files, f"no sources under {package}/"
    return files


@pytest.mark.parametrize("path", sources("ckpt"), ids=lambda p: p.name)
def test_ckpt_imports_only_the_standard_library_xxhash_and_itself(path: Path) -> None:
    foreign = {m for m in imported_modules(path)
               if top(m) not in STDLIB and top(m) not in ("ckpt", "xxhash")}
    assert not foreign, f"ckpt/{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", sources("reference"), ids=lambda p: p.name)
def test_reference_imports_no_torch_and_nothing_above_it(path: Path) -> None:
    allowed = {"reference", "common", "ckpt", "numpy", "ml_dtypes"}
    foreign = {m for m in imported_modules(path)
               if top(m) not in STDLIB and top(m) not in allowed}
    assert not foreign, f"reference/{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", sources("torch_impl"), ids=lambda p: p.name)
def test_torch_impl_imports_no_reference_and_nothing_above_it(path: Path) -> None:
    """What both trees share is in common/ (and ckpt/): a module from the reference would
    make parity circular, so torch_impl names none at all; nor torchao, an oracle of the
    tests (parity/test_mx_torchao.py), never a part of the twin it judges."""
    foreign = {m for m in imported_modules(path)
               if top(m) in ("reference", "parity", "torchao")}
    assert not foreign, f"torch_impl/{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", sources("common"), ids=lambda p: p.name)
def test_common_imports_only_the_standard_library_numpy_ckpt_and_itself(path: Path) -> None:
    foreign = {m for m in imported_modules(path)
               if top(m) not in STDLIB and top(m) not in ("common", "ckpt", "numpy")}
    assert not foreign, f"common/{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", sources("ranks"), ids=lambda p: p.name)
def test_ranks_imports_only_the_standard_library_torch_and_itself(path: Path) -> None:
    """The launcher is no twin and no proof: the modules its jobs run are named as strings
    (job["runner"], the forkserver's preload list), never imported."""
    foreign = {m for m in imported_modules(path)
               if top(m) not in STDLIB and top(m) not in ("ranks", "torch")}
    assert not foreign, f"ranks/{path.name} imports {sorted(foreign)}"


def loaded_after_importing(package: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under `prefixes` in sys.modules after a fresh interpreter imports every
    module of `package` (one interpreter for all: what any one loads, the union holds)."""
    names = [f"{package}.{p.stem}" for p in sources(package) if p.stem != "__init__"]
    code = ("import importlib, json, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            f"loaded = [m for m in sys.modules if m.split('.')[0] in {prefixes!r}]\n"
            "print(json.dumps(sorted(loaded)))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_every_reference_module_leaves_torch_unimported() -> None:
    assert loaded_after_importing("reference", ("torch",)) == []


def test_importing_every_torch_impl_module_loads_no_reference_module() -> None:
    """Transitively: no torch_impl module reaches the reference through common/ or ckpt/."""
    loaded = loaded_after_importing("torch_impl", ("torch_impl", "reference", "parity"))
    assert "torch_impl.train" in loaded  # the probe sees what it imports
    assert [m for m in loaded if not m.startswith("torch_impl")] == []


def test_importing_every_common_module_loads_neither_torch_nor_reference() -> None:
    assert loaded_after_importing("common", ("torch", "reference", "torch_impl", "parity")) == []


def test_importing_every_ranks_module_loads_no_project_tree() -> None:
    loaded = loaded_after_importing("ranks", ("ranks", "reference", "torch_impl", "common",
                                              "ckpt", "parity"))
    assert "ranks.launcher" in loaded  # the probe sees what it imports
    assert [m for m in loaded if not m.startswith("ranks")] == []


PROJECT = ("reference", "torch_impl", "common", "ckpt", "parity", "ranks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside a function (under
    TYPE_CHECKING too: an annotation's import still says which way the modules lean).

    `from P import name` is an edge to the submodule P.name when there is one, else to P's
    `__init__`. So a package `__init__` re-exporting its submodules is no cycle while they
    import their siblings by module path (`from ckpt.errors import ...`); a submodule that
    imports its own package's `__init__` (`from ckpt import X`, X not a submodule) is one.
    """
    paths = [p for package in PROJECT for p in sorted((ROOT / package).rglob("*.py"))]
    modules = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in modules else node.module)
        graph[module_name(path)] = {m for m in edges if m in modules}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each strongly connected component that has one
    (Tarjan's algorithm, then the shortest path from the component's first module back)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for component in components:  # the shortest way from the first module back to itself
        start = min(component)
        paths = {w: [start, w] for w in sorted(graph[start] & component)}
        while start not in paths:
            paths = {w: [*p, w] for v, p in paths.items()
                     for w in sorted(graph[v] & component) if w not in p[1:]} | paths
        found.append(paths[start])
    return found


def test_cycles_finds_a_circle_it_is_given_and_none_in_a_chain() -> None:
    """The detector itself: a three-module circle is named, a chain and a fan are not."""
    circle = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(circle) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"a"}}) == [["a", "a"]]


def test_no_import_cycle_among_the_project_modules() -> None:
    """No module of reference, torch_impl, common, ckpt, parity (the lab included) or ranks imports
    itself back through others (see import_graph for what counts as an edge)."""
    graph = import_graph()
    assert "reference.train" in graph and "parity.lab.cli.train" in graph
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


# -- the proof and the lab: parity/ has two floors, and arrows run down only
#    (lab -> proof -> torch_impl -> reference). The parity tests (parity/test_*.py) sit above
#    both: a claim about a whole command (kill a training process, resume, compare digests)
#    runs the command, so a test may import the lab; nothing the tests import from the proof
#    may.
PARITY = ROOT / "parity"
LAB = PARITY / "lab"


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


@pytest.mark.parametrize("path", sorted((PARITY / "strategies").glob("*.py")),
                         ids=lambda p: p.name)
def test_strategies_never_import_the_drivers(path: Path) -> None:
    """The drivers and the tests draw their inputs from the strategies, never the other way:
    an input a driver and a strategy share is defined in parity/strategies/."""
    up = sorted(m for m in imported_modules(path)
                if m == "parity.drivers" or m.startswith("parity.drivers."))
    assert not up, f"{path.relative_to(ROOT)} imports the drivers: {up}"
