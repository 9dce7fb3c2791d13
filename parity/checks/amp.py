"""Quick checks of the amp claims for `python -m parity report` (drivers: parity/drivers/amp.py
and amp_lists.py)."""

from __future__ import annotations

from parity.claims.amp import ACTIVATION_MIN_COMPARED, LINEAR_MIN_COMPARED, MODEL_MIN_EXACT
from parity.compare import measure
from parity.drivers import amp_lists
from parity.drivers.amp import (
    ACTIVATIONS,
    SUFFIX,
    TORCH_DTYPES,
    activation_pairs,
    dropout_pairs,
    linear_pairs,
    model_pairs,
    toward,
)
from parity.drivers.amp_context import nested_states, saved_signatures
from parity.report import Observation, check
from parity.tolerances import claim


@check("amp.casts")
def _() -> Observation:
    c, worst, n = claim("amp.casts"), 0.0, 0
    for fmt in TORCH_DTYPES:
        for label, a, b, _ in linear_pairs(fmt, 16, 32, 8, seed=0):
            if label.startswith(("saved", "master")):
                worst, n = max(worst, measure(c, a, b)), n + a.size
    return Observation(worst, n, "Linear(32, 8), batch 16")


def _linear_check(fmt: str) -> Observation:
    c, worst, n, least = claim(f"amp.linear_{SUFFIX[fmt]}"), 0.0, 0, 1.0
    for seed in range(3):
        ok_n = total = 0
        for label, a, b, ok in linear_pairs(fmt, 32, 64, 16, seed):
            if label in ("y", "dx", "dW", "db"):
                worst = max(worst, measure(c, a[ok], b[ok]))
                ok_n, total = ok_n + int(ok.sum()), total + ok.size
        n, least = n + ok_n, min(least, ok_n / total)
    if least < LINEAR_MIN_COMPARED:
        worst = float("inf")  # the claim promises the precondition holds this often
    return Observation(worst, n, f"3 Linears (32 x 64 -> 16); precondition met by {least:.1%} "
                                 f"of one Linear's elements at least")


def _activation_check(fmt: str) -> Observation:
    c, worst, n, least = claim(f"amp.activation_{SUFFIX[fmt]}"), 0.0, 0, 1.0
    for name in ACTIVATIONS:
        for _label, a, b, ok in activation_pairs(name, fmt, 4096, seed=0):
            worst = max(worst, measure(c, a[ok], b[ok]))
            n, least = n + int(ok.sum()), min(least, float(ok.mean()))
    if least < ACTIVATION_MIN_COMPARED:
        worst = float("inf")
    return Observation(worst, n, f"4 activations x 4096 lp inputs; precondition met by "
                                 f"{least:.1%} of a tensor's elements at least")


def _model_check(fmt: str) -> Observation:
    c, worst, n, exact, total, max_k = claim(f"amp.model_{SUFFIX[fmt]}"), 0.0, 0, 0, 0, 0
    for activation in ("gelu", "tanh", "relu"):
        for _label, a, b, k in model_pairs(activation, fmt, seed=0):
            worst = max(worst, measure(c, a, toward(b, a, k, fmt)))
            n, exact, total = n + a.size, exact + int((k == 0).sum()), total + k.size
            max_k = max(max_k, int(k.max()))
    if exact < MODEL_MIN_EXACT * total:
        worst = float("inf")
    return Observation(worst, n, f"16-64-64-4, gelu/tanh/relu: {exact / total:.1%} of elements "
                                 f"must be bit-identical (k = 0), largest k {max_k}")


for _fmt in TORCH_DTYPES:
    check(f"amp.linear_{SUFFIX[_fmt]}")(lambda fmt=_fmt: _linear_check(fmt))
    check(f"amp.activation_{SUFFIX[_fmt]}")(lambda fmt=_fmt: _activation_check(fmt))
    check(f"amp.model_{SUFFIX[_fmt]}")(lambda fmt=_fmt: _model_check(fmt))


@check("amp.dropout")
def _() -> Observation:
    c, worst, n = claim("amp.dropout"), 0.0, 0
    for fmt in TORCH_DTYPES:
        for p in (0.1, 0.3, 0.5):
            for _label, a, b, _ in dropout_pairs(fmt, p, 4096, seed=0):
                worst, n = max(worst, measure(c, a, b)), n + a.size
    return Observation(worst, n, "p 0.1, 0.3, 0.5 x 4096 lp inputs, torch's keep-mask (CPU)")


@check("amp.state")
def _() -> Observation:
    c, nests = claim("amp.state"), [[("float16", True), ("bfloat16", False), (None, True)],
                                    [("bfloat16", True), ("float16", True)], [(None, False)]]
    pairs = [nested_states(nest) for nest in nests]
    return Observation(max(measure(c, a, b) for a, b in pairs), sum(len(a) for a, _ in pairs),
                       "3 nests of 1-3 contexts")


@check("amp.saved_bytes")
def _() -> Observation:
    c, worst, n = claim("amp.saved_bytes"), 0.0, 0
    for fmt in TORCH_DTYPES:
        for activation in ("gelu", "tanh", "relu"):
            for _path, mine, theirs in saved_signatures((16, 64, 64, 4), activation, 0.2, fmt,
                                                        32):
                worst, n = max(worst, measure(c, mine, theirs)), n + len(mine)
    return Observation(worst, n, "16-64-64-4 with Dropout(0.2), gelu/tanh/relu, batch 32: "
                                 "saved tensors compared")


@check("amp.op_lists")
def _() -> Observation:
    found, checked = amp_lists.mismatches("cpu")
    return Observation(float(len(found)), checked, "; ".join(found) or
                       "registration on CPU and CUDA keys, dtypes on CPU")

