"""Quick checks of the compile claims for `python -m parity report` (parity/test_compile.py):
one Inductor compile of the small MLP for the numeric claims (cold, seconds to tens of
seconds on 2 cores), Dynamo-only captures (backend "eager") for breaks and recompiles."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import torch

from parity.compare import measure
from parity.drivers import compile as dc
from parity.drivers.compile_breaks import CATALOGUE
from parity.report import Observation, check
from parity.tolerances import claim
from torch_impl import compile as tc
from torch_impl.nn import make_mlp

_NUMERICS: list[dc.Numerics] = []


def _small() -> dc.Numerics:
    """The small case, compiled once per report (both numeric claims read it)."""
    if not _NUMERICS:
        with warnings.catch_warnings():  # torch.jit deprecation from Inductor's own imports
            warnings.simplefilter("ignore", DeprecationWarning)
            _NUMERICS.append(dc.numerics(dc.SMALL))
    return _NUMERICS[0]


def _numerics_obs(cid: str) -> Observation:
    n, c = _small(), claim(cid)
    other, bound = ((n.eager, n.bound_eager) if cid == "compile.eager"
                    else (n.reference, n.bound_reference))
    worst = max(measure(c, n.compiled[k], other[k], scale=bound[k]) for k in other)
    raw = max(float(np.max(np.abs(n.compiled[k].astype(np.float64) - other[k]))) for k in other)
    if not n.compiled_backward:
        worst = float("inf")
    return Observation(worst, sum(v.size for v in other.values()),
                       f"{dc.SMALL}, logits, loss and gradients", raw=raw)


@check("compile.bf16")
def _() -> Observation:
    c = claim("compile.bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        n = dc.numerics(dc.SMALL, precision="bf16")
    worst = max(measure(c, n.compiled[k], n.eager[k], scale=n.bound_eager[k]) for k in n.eager)
    return Observation(worst if n.compiled_backward else float("inf"),
                       sum(v.size for v in n.eager.values()), f"{dc.SMALL}, bfloat16 autocast")


@check("compile.train_step")
def _() -> Observation:
    c = claim("compile.train_step")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)  # Dynamo probes .grad of a non-leaf
        eager, compiled, scale = dc.train_step_pair()
    worst = max(measure(c, compiled[k], eager[k], scale=scale[k]) for k in eager)
    return Observation(worst, sum(v.size for v in eager.values()),
                       f"{dc.SMALL}, one SGD step, parameters and loss")


check("compile.eager")(lambda: _numerics_obs("compile.eager"))
check("compile.reference")(lambda: _numerics_obs("compile.reference"))


@check("compile.breaks")
def _() -> Observation:
    c, bad, n = claim("compile.breaks"), 0.0, 0
    model = make_mlp((16, 32, 8), "gelu", generator=torch.Generator().manual_seed(0))
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(1))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Dynamo probes .grad of a non-leaf
        for e in CATALOGUE:
            broken, repaired = tc.explain(e.broken, model, x), tc.explain(e.repaired, model, x)
            counts = np.array([broken.graph_count, broken.graph_break_count,
                               repaired.graph_count, repaired.graph_break_count])
            bad += measure(c, counts, np.array([2, 1, 1, 0]))
            bad += measure(c, e.repaired(model, x), e.broken(model, x))
            n += counts.size + 6 * 8
    return Observation(bad, n, f"{len(CATALOGUE)} seeded breaks and their repairs")


@check("compile.recompiles")
def _() -> Observation:
    c = claim("compile.recompiles")
    got = np.array([dc.count_shape_recompiles(m).graphs for m in dc.MODES])
    want = np.array([dc.expected_graphs(m) for m in dc.MODES])
    return Observation(measure(c, got, want), got.size,
                       f"graphs per mode {dict(zip(dc.MODES, got.tolist(), strict=True))}")
