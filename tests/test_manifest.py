"""Every topic's twin manifest (NOTE [ Twin manifests ] in parity/claims/__init__.py) held to
the code, both ways: each public name of a twin module has a row, in its file's order; each
row resolves, its alias in torch; each claim it names exists and is its topic's (or says why
not), and each claim of the topic is named; each module of reference/ and torch_impl/ is
covered by exactly one manifest. The checks are functions returning the problems found, so
the last test can seed a defect into a real manifest and see each check report it.

Names are read off the source (ast: definition order, and what a module defines rather than
imports); objects are resolved by importing the modules.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
from pathlib import Path

import pytest

from parity.claims import TOPICS, Manifest, Twin
from parity.tolerances import CLAIMS

ROOT = Path(__file__).resolve().parents[1]
TREES = ("reference", "torch_impl")
_BY_ID = {c.id: c for c in CLAIMS}


def _module_file(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _bound(target: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


@functools.cache
def defined_names(module: str) -> tuple[str, ...]:
    """The public names `module` defines at module level (not `_`-prefixed, not imported:
    classes, functions and assignments, under an `if` or `try` too), in the order the file
    first defines them."""
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    found.extend(_bound(target))
            elif isinstance(node, ast.AnnAssign):
                found.extend(_bound(node.target))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for handler in getattr(node, "handlers", ()):
                    visit(handler.body)
                visit(node.orelse)
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(_module_file(module).read_text()).body)
    return tuple(dict.fromkeys(n for n in found if not n.startswith("_")))


def tree_modules() -> list[str]:
    """Every module of reference/ and torch_impl/ but the packages' __init__."""
    return [f"{tree}.{p.stem}" for tree in TREES
            for p in sorted(ROOT.joinpath(tree).glob("*.py")) if p.stem != "__init__"]


@functools.cache
def manifests() -> dict[str, Manifest]:
    return {t: importlib.import_module(f"parity.claims.{t}").MANIFEST for t in TOPICS}


def _split(side: str) -> tuple[str, str]:
    module, qualname = side.split(":")
    return module, qualname


def entries(m: Manifest) -> list[tuple[int, str, str]]:
    """(row index, module, name) of each entry: the first row naming a top-level name of one
    of the manifest's twin modules (rule 1)."""
    first: dict[tuple[str, str], int] = {}
    for i, row in enumerate(m.rows):
        for module, qualname in map(_split, row.sides):
            if module in m.modules and "." not in qualname:
                first.setdefault((module, qualname), i)
    return sorted((i, module, name) for (module, name), i in first.items())


def _in_order(listed: list[str], names: tuple[str, ...]) -> bool:
    return listed == [n for n in names if n in listed]


def name_problems(m: Manifest) -> list[str]:
    """Rules 1 and 2: every public name has a row, the entries in the file's order, and
    each `disorder` still parts an order."""
    problems = []
    found = entries(m)
    for module in m.modules:
        if module.split(".")[0] not in TREES or not _module_file(module).is_file():
            problems.append(f"{module}: a twin module is a file of {' or '.join(TREES)}")
            continue
        names = defined_names(module)
        listed = [(i, n) for i, mod, n in found if mod == module]
        problems += [f"{module}: {n} has no row" for n in names
                     if n not in {n for _, n in listed}]
        problems += [f"{module}: {n} is named but the file defines no public {n}"
                     for _, n in listed if n not in names]
        kept = [n for i, n in listed if not m.rows[i].disorder]
        if not _in_order(kept, names):
            problems.append(f"{module}: the rows list {kept} but the file defines "
                            f"{[n for n in names if n in kept]}")
    for i, row in enumerate(m.rows):
        if not row.disorder:
            continue
        own = {module for j, module, _ in found if j == i}
        parted = [module for module in own if not _in_order(
            [n for j, mod, n in found if mod == module and (j == i or not m.rows[j].disorder)],
            defined_names(module))]
        if not parted:
            problems.append(f"row {row.name}: disorder says the orders part, but they do not")
    return problems


def resolve(side: str) -> object:
    """The object "module:qualname" names (AttributeError/ImportError when it names none)."""
    module, qualname = _split(side)
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_alias(dotted: str) -> object:
    """The torch object a dotted path names: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def resolve_problems(m: Manifest) -> list[str]:
    """Rules 3 and 4, the helpers' files and the headline test."""
    problems = []
    for row in m.rows:
        objects = {}
        for side in (*row.sides, row.alias):
            if side is None:
                continue
            try:
                objects[side] = resolve(side) if ":" in side else resolve_alias(side)
            except (ImportError, AttributeError) as e:
                problems.append(f"row {row.name}: {side} does not resolve ({e})")
        if row.torch in objects and row.alias in objects and (
                objects[row.torch] is not objects[row.alias]):
            problems.append(f"row {row.name}: {row.torch} is not {row.alias}")
        if row.name not in [_split(s)[1].split(".")[-1] for s in row.sides]:
            problems.append(f"row {row.name}: the name is not the last part of {row.sides}")
    for helper in m.helpers:
        if not _module_file(helper.module).is_file():
            problems.append(f"helper {helper.module}: no such file")
    path, _, test = m.headline.partition("::")
    tests = ([n.name for n in ast.parse((ROOT / path).read_text()).body
              if isinstance(n, ast.FunctionDef)] if (ROOT / path).is_file() else [])
    if test not in tests:
        problems.append(f"headline {m.headline}: no such test")
    return problems


def claim_problems(m: Manifest) -> list[str]:
    """Rule 5: claims named exist, are the topic's or borrowed with a why, and all are named."""
    problems = []
    named = {c for row in m.rows for c in row.claims}
    borrowed = dict(m.borrowed)
    for row in m.rows:
        for cid in row.claims:
            if cid not in _BY_ID:
                problems.append(f"row {row.name}: no claim {cid}")
            elif _BY_ID[cid].topic != m.topic and cid not in borrowed:
                problems.append(f"row {row.name}: {cid} is another topic's; borrowed says why")
    for cid, why in m.borrowed:
        if cid not in named or not why.strip() or _BY_ID.get(cid, m).topic == m.topic:
            problems.append(f"borrowed {cid}: not another topic's claim a row names, with why")
    problems += [f"claim {c.id}: no row names it" for c in CLAIMS
                 if c.topic == m.topic and c.id not in named]
    return problems


def coverage_problems(found: dict[str, Manifest]) -> list[str]:
    """Rule 6: every module of the two trees in exactly one manifest, twin or helper."""
    covered: dict[str, list[str]] = {}
    for topic, m in found.items():
        for module in (*m.modules, *(h.module for h in m.helpers)):
            covered.setdefault(module, []).append(topic)
    problems = [f"{mod}: in no manifest" for mod in tree_modules() if mod not in covered]
    problems += [f"{mod}: in {topics}" for mod, topics in covered.items() if len(topics) > 1]
    return problems


def test_each_topic_declares_its_manifest() -> None:
    """parity.claims.<topic>.MANIFEST exists for every topic and is that topic's."""
    assert {t: m.topic for t, m in manifests().items()} == {t: t for t in TOPICS}


@pytest.mark.parametrize("topic", TOPICS)
def test_each_public_name_has_a_row_in_definition_order(topic: str) -> None:
    """Every public name of each twin module has a row; their entries in the file's order."""
    assert name_problems(manifests()[topic]) == []


@pytest.mark.parametrize("topic", TOPICS)
def test_each_row_resolves_and_each_alias_is_torchs(topic: str) -> None:
    """Every "module:qualname" resolves, every alias resolves in torch and is the torch side."""
    assert resolve_problems(manifests()[topic]) == []


@pytest.mark.parametrize("topic", TOPICS)
def test_each_claim_named_exists_and_each_claim_is_named(topic: str) -> None:
    """Claims named exist and are the topic's or borrowed; every claim of the topic is named."""
    assert claim_problems(manifests()[topic]) == []


def test_each_module_of_both_trees_is_in_exactly_one_manifest() -> None:
    """reference/ and torch_impl/ are covered: each module a twin or a helper, once."""
    assert coverage_problems(manifests()) == []


def _with_row(m: Manifest, i: int, **changes: object) -> Manifest:
    """m with row i changed (dataclasses.replace of the row)."""
    rows = list(m.rows)
    rows[i] = dataclasses.replace(rows[i], **changes)
    return dataclasses.replace(m, rows=tuple(rows))


def test_a_row_missing_its_counterpart_or_its_why_is_refused() -> None:
    """A reference name with neither a torch object nor an alias must say why; so must a
    torch name without a reference object."""
    for lone in ({"reference": "reference.fma:fma"}, {"torch": "torch_impl.optim:IMPLIED"}):
        with pytest.raises(ValueError, match="says why"):
            Twin("lone", **lone)


def test_the_checks_report_each_seeded_defect() -> None:
    """A dropped row, two rows swapped, a wrong qualname, an unknown claim, another topic's
    claim, a claim no row names, a stale disorder, an alias that is not the torch side and
    an uncovered module: each gives a problem that names it; the real manifest gives none."""
    m = manifests()["loss_scaling"]
    first, second = [i for i, mod, _ in entries(m) if mod == "reference.loss_scale_kernels"][:2]
    both = next(i for i, row in enumerate(m.rows) if row.torch and row.alias)
    swapped = list(m.rows)
    swapped[first], swapped[second] = m.rows[second], m.rows[first]
    seeds = {
        "has no row": name_problems(dataclasses.replace(m, rows=m.rows[:first] +
                                                        m.rows[first + 1:])),
        "but the file defines": name_problems(dataclasses.replace(m, rows=tuple(swapped))),
        "does not resolve": resolve_problems(_with_row(
            m, first, reference=f"{m.rows[first].reference}_")),
        "no claim": claim_problems(_with_row(m, first, claims=("loss_scaling.no_such",))),
        "another topic's": claim_problems(_with_row(m, first, claims=("formats.decode",))),
        "no row names it": claim_problems(_with_row(m, first, claims=())),
        "they do not": name_problems(_with_row(m, first, disorder="seeded")),
        "is not torch.": resolve_problems(_with_row(m, both, alias="torch.optim.SGD")),
        "in no manifest": coverage_problems({**manifests(), "numerics": dataclasses.replace(
            manifests()["numerics"], helpers=manifests()["numerics"].helpers[1:])}),
    }
    assert name_problems(m) == resolve_problems(m) == claim_problems(m) == []
    missed = [what for what, problems in seeds.items()
              if not any(what in p for p in problems)]
    assert missed == [], f"seeded defects no check reported: {missed}"
