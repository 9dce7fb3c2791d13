"""Quick checks of the transformer's compile claims for `python -m parity report`
(parity/test_compile_gpt.py): two Inductor compiles of `train --model gpt`'s shape (float32,
read by compile.gpt_eager and compile.gpt_reference, and bfloat16 autocast), each with its
64-probe bound; Dynamo-only captures (backend "eager") for the recompiles."""

from __future__ import annotations

import warnings

import numpy as np

from parity.compare import measure
from parity.drivers import compile_gpt as cg
from parity.report import Observation, check
from parity.tolerances import claim

_NUMERICS: dict[str, cg.GptNumerics] = {}


def numerics(precision: str) -> cg.GptNumerics:
    """The small case compiled once per report and precision."""
    if precision not in _NUMERICS:
        with warnings.catch_warnings():  # torch.jit deprecation from Inductor's own imports
            warnings.simplefilter("ignore", DeprecationWarning)
            _NUMERICS[precision] = cg.numerics(cg.GPT_SMALL, precision)
    return _NUMERICS[precision]


def _obs(cid: str, precision: str, against: str) -> Observation:
    n, c = numerics(precision), claim(cid)
    other = n.eager if against == "eager" else n.reference
    assert other is not None
    keys = cg.claimed(other)
    worst = max(measure(c, n.compiled[k], other[k], scale=n.bound[k]) for k in keys)
    raw = max(float(np.max(np.abs(n.compiled[k].astype(np.float64) - other[k].astype(
        np.float64)))) for k in keys)
    note = f"{cg.GPT_SMALL}, logits, loss and gradients"
    if len(keys) < len(other):  # NOTE [ torch 2.6's compiled token-embedding gradient ]
        wrong = measure(c, n.compiled[cg.WTE], other[cg.WTE], scale=n.bound[cg.WTE])
        note += f"; {cg.WTE}'s gradient left out, wrong as stated ({wrong:.3g} of the bound)"
        worst = worst if wrong > 1 else float("inf")
    return Observation(worst if n.compiled_backward else float("inf"),
                       sum(other[k].size for k in keys), note, raw=raw)


check("compile.gpt_eager")(lambda: _obs("compile.gpt_eager", "fp32", "eager"))
check("compile.gpt_reference")(lambda: _obs("compile.gpt_reference", "fp32", "reference"))
check("compile.gpt_bf16")(lambda: _obs("compile.gpt_bf16", "bf16", "eager"))


@check("compile.gpt_recompiles")
def _() -> Observation:
    c = claim("compile.gpt_recompiles")
    got = [cg.count_shape_recompiles(m).graphs for m in cg.MODES]
    want = [cg.expected_graphs(m) for m in cg.MODES]
    fulls = [cg.count_full_block(m) for m in ("dynamic", "mark_dynamic")]
    for full in fulls:
        got += [-1, -1] if isinstance(full, str) else [full.graphs, len(full.failed_guards)]
        want += [1, 0]
    return Observation(measure(c, np.array(got), np.array(want)), len(got),
                       f"graphs per mode {dict(zip(cg.MODES, got[:4], strict=True))}; a full "
                       f"block after (4, 5): dynamic {got[4]} graph(s), mark_dynamic "
                       f"{got[6]} graph(s), failed guards {got[5]} and {got[7]}")
