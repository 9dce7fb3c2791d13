"""The optional packages the parity tests use as oracles (pyproject's `oracles` extra), each
imported at the one version whose source the claims read (parity/claims EXTRAS), or skipped
with the reason, so that the report reads their claims SKIPPED (parity/lab/report.py).

A package that is installed but whose import raises (a broken install: a missing compiled
part, a torch it was not built for) is skipped the same way, its reason quoting the error and
the reinstall command: never a collection error, which would stop every other test file of
the run and leave the report's table NOT CHECKED with no reason. BROKEN keeps what failed, so
the report can count the package as missing (report_plugin.missing_extras).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from parity.claims import EXTRAS

BROKEN: dict[str, str] = {}  # package -> its import error, in this process


def import_extra(name: str, role: str) -> ModuleType:
    """`name` imported, for a test module whose claims it is `role` of; a module-level skip
    when it is absent, broken (its import raises), or not the version EXTRAS pins (torch
    2.6's torchao 0.9.0, for one, has no nvfp4_tensor and no ScaleCalculationMode)."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:  # the package is there and needs a module that is not
            BROKEN[name] = f"{type(e).__name__}: {e}"
            pytest.skip(_broken(name, role), allow_module_level=True)
        pytest.skip(f"{name} is {role}, and it is not installed (pip install -e .[oracles])",
                    allow_module_level=True)
    except ImportError as e:
        BROKEN[name] = f"{type(e).__name__}: {e}"
        pytest.skip(_broken(name, role), allow_module_level=True)
    if module.__version__ != EXTRAS[name]:
        pytest.skip(f"the {name} claims read {EXTRAS[name]}'s source; installed "
                    f"{module.__version__}", allow_module_level=True)
    return module


def _broken(name: str, role: str) -> str:
    return (f"{name} is {role}, and it is installed but its import fails ({BROKEN[name]}): "
            f"reinstall it (pip install --force-reinstall {name}=={EXTRAS[name]})")
