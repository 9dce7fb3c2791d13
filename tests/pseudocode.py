"""The scalar pseudocode an update rule's docstring carries, compiled as it stands.

An update rule's docstring (the loss scale's update, fp8 current and delayed scaling, the MX
scale rule, the ring all-reduce's element) writes the rule as a Python function, indented
inside the prose; one test per rule compiles that text with `pseudocode` and holds the
vectorized code to it, bit for bit (jmp's pseudocode drifted from its code; ours cannot
without a test failing).

The function is the block Python itself would read: the line `def name(`, then every line
indented deeper than it (or blank), up to the first line that is not. So it may stand last
in the docstring, before more prose, or before the next pseudocode function.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np


def f32(v: float) -> float:
    """Round a Python float to float32, nearest even (the `f32` of every docstring's prose);
    overflow to inf is part of the rule (from FLT_MAX + half its ulp up: that tie goes to inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def pseudocode_source(doc: str | None, name: str) -> str:
    """The text of `def name(...)` in the docstring `doc`, dedented; AssertionError naming
    `name` when the docstring has no such function."""
    lines = (doc or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {name}(")),
                 None)
    assert start is not None, f"the docstring lost its {name} pseudocode"
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip()
                                or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end])).strip("\n") + "\n"


def pseudocode(doc: str | None, name: str, **names: Any) -> Callable[..., Any]:
    """The function `name` written in the docstring `doc`, compiled with `math`, `f32` and
    `names` (the other helpers its prose defines: word, fp8, ...) as its globals."""
    namespace: dict[str, Any] = {"math": math, "f32": f32, **names}
    exec(pseudocode_source(doc, name), namespace)  # the docstring is this project's own text
    return namespace[name]
