"""The import direction docs/layout.md draws: parity -> torch_impl -> reference -> ckpt.

Read from the source with `ast` (no import runs), plus one subprocess proving that importing
every reference module leaves torch unimported.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What torch_impl may take from reference: plain data both sides must share literally.
TORCH_IMPL_MAY_IMPORT = {"reference.fault_catalogue", "reference.format_spec",
                         "reference.gpt_config", "reference.numerics_report",
                         "reference.recompute_plans", "reference.train_config"}
STDLIB = sys.stdlib_module_names


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at any depth (function-level imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
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
    allowed = {"reference", "ckpt", "numpy", "ml_dtypes"}
    foreign = {m for m in imported_modules(path)
               if top(m) not in STDLIB and top(m) not in allowed}
    assert not foreign, f"reference/{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", sources("torch_impl"), ids=lambda p: p.name)
def test_torch_impl_takes_only_plain_data_from_reference(path: Path) -> None:
    modules = imported_modules(path)
    above = {m for m in modules if top(m) == "parity"}
    from_reference = {m for m in modules if top(m) == "reference"} - TORCH_IMPL_MAY_IMPORT
    assert not above, f"torch_impl/{path.name} imports {sorted(above)}"
    assert not from_reference, (f"torch_impl/{path.name} imports {sorted(from_reference)}: "
                                "a computation from the reference would make parity circular")


def test_importing_every_reference_module_leaves_torch_unimported() -> None:
    names = [f"reference.{p.stem}" for p in sources("reference") if p.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for name in {names!r}: importlib.import_module(name)\n"
            "sys.exit('torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr or "a reference module imported torch"
