"""Strategies for the fp8_scaling claims: amaxes and tensors with the values a scale must
survive (0, inf, NaN, subnormals, values near FLT_MAX), and amax histories for TE's update."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from common.fp8_recipes import AMAX_ALGOS, FP8_FORMATS, MARGINS
from parity.strategies.edges import declared_values

FP8_AMAX_EDGES = ("zero", "inf", "nan", "subnormal", "huge", "tiny_normal")
_FLT_MAX = float(np.finfo(np.float32).max)
_EDGE_VALUES = {
    "zero": 0.0,
    "inf": float("inf"),
    "nan": float("nan"),
    "subnormal": float.fromhex("0x1p-149"),  # the smallest float32 subnormal
    "huge": _FLT_MAX,  # 0x1.fffffep127
    "tiny_normal": float.fromhex("0x1p-126"),
}


def _binade_values(rng: np.random.Generator, shape: tuple[int, ...], low: int, high: int
                   ) -> np.ndarray:
    """sign * 2^e * (1 + f), e uniform in [low, high]: float32 values across many binades."""
    e = rng.integers(low, high + 1, size=shape)
    values = rng.choice([-1.0, 1.0], size=shape) * np.ldexp(1.0 + rng.random(shape), e)
    with np.errstate(over="ignore", under="ignore"):
        return values.astype(np.float32)


@st.composite
def fp8_amaxes(draw: st.DrawFn, max_n: int = 16) -> tuple[str, np.ndarray]:
    """(edge, float32 amaxes >= 0): n in [1, max_n] values across every float32 binade, one
    of them (at least) the named edge value (FP8_AMAX_EDGES)."""
    edge = draw(st.sampled_from(FP8_AMAX_EDGES))
    n = draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = np.abs(_binade_values(rng, (n,), -149, 127))
    a[rng.integers(0, n)] = _EDGE_VALUES[edge]
    return edge, a


@st.composite
def fp8_tensors(draw: st.DrawFn) -> tuple[np.ndarray, str, int | None, bool]:
    """(x float32 of shape (rows, cols), fmt, axis None/0/-1, power_of_2): values spanning
    `spread` binades around 2^top; with some probability a zero row, a NaN, an inf, or
    subnormal / near-FLT_MAX rows (so the scale sees amax 0, NaN, inf, tiny and huge)."""
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    spread = draw(st.integers(0, 40))
    top = draw(st.integers(-149 + spread, 127))
    x = _binade_values(rng, (rows, cols), top - spread, top)
    for edge in draw(st.sets(st.sampled_from(FP8_AMAX_EDGES), max_size=3)):
        r, c = int(rng.integers(rows)), int(rng.integers(cols))
        if edge in ("zero", "subnormal", "huge"):
            x[r, :] = np.float32(_EDGE_VALUES[edge]) * rng.choice([-1, 1], cols)
        else:
            x[r, c] = _EDGE_VALUES[edge] * float(rng.choice([-1, 1]))
    fmt = draw(declared_values(FP8_FORMATS))
    axis = draw(st.sampled_from([None, 0, -1]))
    return x, fmt, axis, draw(st.booleans())


@st.composite
def fp8_histories(draw: st.DrawFn) -> dict:
    """Arguments of a delayed-scaling run: a float32 amax history (L, n) whose entries mix
    every binade with 0, inf, NaN, subnormals and FLT_MAX, a float32 scale (n,) (positive,
    sometimes FLT_MAX), fmt, margin over its whole declared range (common.fp8_recipes.MARGINS:
    hypothesis reaches its edges, where the twin once raised), algo, and `steps` amaxes
    (steps, n) to record one per update."""
    length, n = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    steps = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    low = draw(st.integers(-149, 120))
    history = np.abs(_binade_values(rng, (length, n), low, min(low + 30, 127)))
    amaxes = np.abs(_binade_values(rng, (steps, n), low, min(low + 30, 127)))
    for edge in draw(st.sets(st.sampled_from(FP8_AMAX_EDGES), max_size=4)):
        target = history if draw(st.booleans()) else amaxes
        target[rng.integers(target.shape[0]), rng.integers(n)] = _EDGE_VALUES[edge]
    scale = np.abs(_binade_values(rng, (n,), -40, 60))
    if draw(st.booleans()):
        scale[0] = np.float32(_FLT_MAX)
    return {"history": history, "scale": scale, "amaxes": amaxes,
            "fmt": draw(declared_values(FP8_FORMATS)),
            "margin": draw(declared_values(MARGINS)),
            "algo": draw(declared_values(AMAX_ALGOS))}
