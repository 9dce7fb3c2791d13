"""The optional packages the parity tests use as oracles (pyproject's `oracles` extra), each
imported at the one version whose source the claims read (parity/claims EXTRAS), or skipped
with the reason, so that the report reads their claims SKIPPED (parity/lab/report.py)."""

from __future__ import annotations

from types import ModuleType

import pytest

from parity.claims import EXTRAS


def import_extra(name: str, role: str) -> ModuleType:
    """`name` imported, for a test module whose claims it is `role` of; a module-level skip
    when it is absent or not the version EXTRAS pins (torch 2.6's torchao 0.9.0, for one,
    has no nvfp4_tensor and no ScaleCalculationMode)."""
    module = pytest.importorskip(name, reason=f"{name} is {role} (pip install -e .[oracles])")
    if module.__version__ != EXTRAS[name]:
        pytest.skip(f"the {name} claims read {EXTRAS[name]}'s source; installed "
                    f"{module.__version__}", allow_module_level=True)
    return module
