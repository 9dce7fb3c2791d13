"""Named hypothesis strategies for edge domains, shared by the tests and `python -m parity fuzz`.

A test that targets an edge also shows the edge was reached (hypothesis.event / target,
or an explicit guard). One section per topic.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from reference.formats import FloatFormat, get_format

# ---------------------------------------------------------------- formats
# Values are built from a format's bit widths with Python's exact float arithmetic (math.ldexp
# on integers), not with reference.formats' rounding, so a strategy cannot share a bug with
# the code it tests. Each returns Python floats exactly representable in float32 unless it
# says float64.


def member_value(fmt: FloatFormat, magnitude_code: int) -> float:
    """The value of a non-negative code, from the bit layout alone (exact)."""
    m = fmt.mantissa_bits
    field, frac = magnitude_code >> m, magnitude_code & (2**m - 1)
    if field == 0:
        return math.ldexp(frac, 1 - fmt.bias - m)
    return math.ldexp(2**m + frac, field - fmt.bias - m)


def _max_code(fmt: FloatFormat) -> int:
    top = 2**fmt.exponent_bits - 1
    return (top << fmt.mantissa_bits) + 2**fmt.mantissa_bits - 2 if fmt.convention == "fn" \
        else (top << fmt.mantissa_bits) - 1


def _signed(values: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    return st.tuples(values, st.booleans()).map(lambda vs: -vs[0] if vs[1] else vs[0])


def _f32(x: float) -> np.float32:
    """x as a float32; values beyond float32's range become +-inf on purpose."""
    with np.errstate(over="ignore"):
        return np.float32(x)


def _f32_step(x: float, k: int) -> float:
    """x moved by k float32 ulps (k may be negative)."""
    v = _f32(x)
    toward = np.float32(np.inf if k > 0 else -np.inf)
    with np.errstate(over="ignore"):  # stepping past float32's max gives inf, on purpose
        for _ in range(abs(k)):
            v = np.nextafter(v, toward)
    return float(v)


def members(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Every finite value of the format, either sign."""
    f = get_format(fmt)
    return _signed(st.integers(0, _max_code(f)).map(lambda c: member_value(f, c)))


def ties(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Exact midpoints between adjacent members, including the tie just above max."""
    f = get_format(fmt)

    def midpoint(c: int) -> float:
        lo = member_value(f, c)
        hi = member_value(f, c + 1) if c < _max_code(f) else lo + 2.0 ** (
            f.emax - f.mantissa_bits)
        return (lo + hi) / 2

    return _signed(st.integers(0, _max_code(f)).map(midpoint))


def near_ties(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """One to three float32 ulps either side of a tie."""
    return st.tuples(ties(fmt), st.sampled_from([-3, -2, -1, 1, 2, 3])).map(
        lambda t: _f32_step(*t))


def overflow_edge(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Around the overflow boundary max + ulp(max)/2, at max, and far beyond."""
    f = get_format(fmt)
    boundary = f.max + 2.0 ** (f.emax - f.mantissa_bits - 1)
    near = st.integers(-4, 4).map(lambda k: _f32_step(boundary, k))
    far = st.sampled_from([f.max, 2 * f.max, f.max + 2.0 ** (f.emax - f.mantissa_bits),
                           float(np.finfo(np.float32).max)])
    return _signed(st.one_of(near, far))


def subnormal_edge(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """Around tiny, the smallest subnormal, and half the smallest subnormal."""
    f = get_format(fmt)
    anchors = [f.tiny, f.smallest_subnormal, f.smallest_subnormal / 2,
               f.tiny - f.smallest_subnormal]
    return _signed(st.tuples(st.sampled_from(anchors), st.integers(-3, 3)).map(
        lambda t: _f32_step(*t)))


def specials() -> st.SearchStrategy[float]:
    """Signed zeros and infinities."""
    return st.sampled_from([0.0, -0.0, math.inf, -math.inf])


def nan_payloads() -> st.SearchStrategy[np.float32]:
    """float32 NaNs of either sign, quiet or signalling, with any payload."""
    return st.tuples(st.integers(1, 2**23 - 1), st.booleans()).map(
        lambda t: np.uint32((0xFF800000 if t[1] else 0x7F800000) | t[0]).view(np.float32))


def float32_bits() -> st.SearchStrategy[np.float32]:
    """Any float32 bit pattern."""
    return st.integers(0, 2**32 - 1).map(lambda b: np.uint32(b).view(np.float32))


EDGE_NAMES = ("ties", "near_ties", "overflow_edge", "subnormal_edge", "members", "specials",
              "nan_payloads", "float32_bits")


def edge_float32(fmt: str | FloatFormat) -> st.SearchStrategy[np.float32]:
    """Any of the named edges for `fmt`, as float32 scalars."""
    finite = st.one_of(ties(fmt), near_ties(fmt), overflow_edge(fmt), subnormal_edge(fmt),
                       members(fmt), specials())
    return st.one_of(finite.map(_f32), nan_payloads(), float32_bits())


def float32_arrays(fmt: str | FloatFormat, max_size: int = 64) -> st.SearchStrategy[np.ndarray]:
    """1-d float32 arrays of edge values (many values per example: cheap and thorough)."""
    return st.lists(edge_float32(fmt), min_size=1, max_size=max_size).map(
        lambda v: np.array(v, dtype=np.float32))


def double_rounding_cases(fmt: str | FloatFormat) -> st.SearchStrategy[float]:
    """float64 values within a few float64 ulps of float32-representable ties of `fmt`:
    rounding through float32 lands on the tie, and the tie then breaks the wrong way
    whenever the offset's sign disagrees with the even neighbour."""
    return st.tuples(ties(fmt), st.integers(-3, 3), st.integers(0, 20)).map(
        lambda t: t[0] + math.copysign(t[1] * math.ulp(t[0]) * 2.0 ** t[2], t[0])
        if t[0] != 0 and math.isfinite(t[0]) else t[0])


def float64_arrays(fmt: str | FloatFormat, max_size: int = 64) -> st.SearchStrategy[np.ndarray]:
    """1-d float64 arrays: double-rounding cases, edges, and any finite float64."""
    values = st.one_of(
        double_rounding_cases(fmt),
        edge_float32(fmt).map(float),
        st.floats(allow_nan=True, allow_infinity=True, width=64),
    )
    return st.lists(values, min_size=1, max_size=max_size).map(
        lambda v: np.array(v, dtype=np.float64))

# ---------------------------------------------------------------- nn
# Arrays for the compact model: float32/float64 values spread over several orders of
# magnitude (including exact zeros and signed zeros, which ReLU's sign rules reach), shapes
# with 1-3 leading batch dimensions, and small layer sizes.

NN_DTYPES = (np.float32, np.float64)


def nn_shapes(min_dims: int = 1, max_dims: int = 3, max_side: int = 9
              ) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes for layer inputs: 1-3 dimensions, sides 1..max_side."""
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def nn_arrays(draw: st.DrawFn, shape: tuple[int, ...], dtype: type,
              max_magnitude: float = 30.0) -> np.ndarray:
    """Values x = s * N(0, 1)-like with s in {1e-3, 1, max_magnitude}, some exact +-0."""
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from((1e-3, 1.0, max_magnitude)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale
    zeros = rng.random(shape) < draw(st.sampled_from((0.0, 0.1)))
    x[zeros] = np.copysign(0.0, rng.standard_normal(int(zeros.sum())))
    return x.astype(dtype)


def mlp_sizes(max_layers: int = 4, max_width: int = 24) -> st.SearchStrategy[list[int]]:
    """Layer widths (d_in, h_1, ..., d_out) of a small MLP: 2..max_layers+1 entries."""
    return st.lists(st.integers(1, max_width), min_size=2, max_size=max_layers + 1)


# ---------------------------------------------------------------- optim
# torch's CPU kernels process 2 vectors per iteration (32 float32 / 16 float64 with AVX512,
# 16 / 8 with AVX2) and finish with a scalar tail; sizes around those multiples, 0-d
# parameters and sizes of one element reach both paths (NOTE [ FMA in torch's CPU kernels ]).
OPTIM_TAIL_SIZES = (1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)


def optim_shapes(max_params: int = 3) -> st.SearchStrategy[list[tuple[int, ...]]]:
    """Parameter shapes: 0-d, vector-tail sizes, small matrices; 1..max_params of them."""
    shape = st.one_of(
        st.just(()),
        st.sampled_from(OPTIM_TAIL_SIZES).map(lambda n: (n,)),
        st.tuples(st.integers(1, 9), st.integers(1, 9)),
    )
    return st.lists(shape, min_size=1, max_size=max_params)


def optim_grad_scales() -> st.SearchStrategy[float]:
    """Gradient magnitudes 2**-40 .. 2**40 (powers of two), inside the exact-FMA domain."""
    return st.integers(-40, 40).map(lambda e: math.ldexp(1.0, e))


def optim_lrs() -> st.SearchStrategy[float]:
    """Learning rates: 0, tiny, typical, large; arbitrary decimals (not dyadic)."""
    return st.one_of(st.just(0.0), st.floats(1e-6, 1.0), st.sampled_from([1e-3, 0.1, 3.0]))


def optim_sgd_hyper() -> st.SearchStrategy[dict]:
    """SGD keyword arguments torch accepts (nesterov only with momentum > 0, dampening 0)."""
    def build(lr: float, momentum: float, dampening: float, wd: float, nesterov: bool,
              maximize: bool) -> dict:
        nesterov = nesterov and momentum > 0
        return {"lr": lr, "momentum": momentum, "dampening": 0 if nesterov else dampening,
                "weight_decay": wd, "nesterov": nesterov, "maximize": maximize}
    return st.builds(build, optim_lrs(), st.sampled_from([0, 0.5, 0.9, 0.99, 1.3]),
                     st.sampled_from([0, 0.1, 0.9]), st.sampled_from([0, 1e-4, 0.3]),
                     st.booleans(), st.booleans())


def optim_adam_hyper() -> st.SearchStrategy[dict]:
    """Adam/AdamW keyword arguments: betas incl. 0 and the lerp branch edge 1 - beta1 = 0.5."""
    beta = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.999]), st.floats(0.0, 0.9999))
    return st.fixed_dictionaries({
        "lr": optim_lrs(),
        "betas": st.tuples(beta, beta),
        "eps": st.sampled_from([0.0, 1e-8, 1e-3]),
        "weight_decay": st.sampled_from([0, 1e-2, 0.5]),
        "amsgrad": st.booleans(),
        "maximize": st.booleans(),
    })


# ---------------------------------------------------------------- data


# A sampler run: `epochs` epochs of batches, interrupted (state saved, a fresh sampler
# loaded from it) after `interrupt` batches. `kind` says where the cut fell, for events.
DATA_INTERRUPTIONS = ("start", "mid_epoch", "epoch_boundary", "end")


def data_batches_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches one epoch yields: floor(n / B) with drop_last, ceil(n / B) without."""
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


@st.composite
def data_sampler_runs(draw: st.DrawFn, max_samples: int = 64) -> dict:
    """{seed, num_samples, batch_size, drop_last, epochs, interrupt, kind}: a resume case.

    The cut is chosen as one of DATA_INTERRUPTIONS (start, mid-epoch, exactly at an epoch
    boundary, after the last batch); `kind` is recomputed from the numbers, so a test can
    hypothesis.event() the edge it really reached.
    """
    want = draw(st.sampled_from(DATA_INTERRUPTIONS))
    seed = draw(st.integers(0, 2**32 - 1))
    if want == "mid_epoch":  # n // batch_size >= 2: an epoch has an inside
        n = draw(st.integers(2, max_samples))
        batch_size = draw(st.integers(1, n // 2))
    else:
        n = draw(st.integers(1, max_samples))
        batch_size = draw(st.integers(1, n + 2))
    drop_last = draw(st.booleans())
    epochs = draw(st.integers(2, 3))  # >= 2: an epoch boundary before the end exists
    per_epoch = data_batches_per_epoch(n, batch_size, drop_last)
    total = epochs * per_epoch
    if want == "start" or total == 0:
        interrupt = 0
    elif want == "end":
        interrupt = total
    elif want == "epoch_boundary" or per_epoch < 2:
        interrupt = per_epoch * draw(st.integers(1, epochs - 1))
    else:
        interrupt = per_epoch * draw(st.integers(0, epochs - 1)) + draw(
            st.integers(1, per_epoch - 1))
    if interrupt == 0:
        kind = "start"
    elif interrupt == total:
        kind = "end"
    elif interrupt % per_epoch == 0:
        kind = "epoch_boundary"
    else:
        kind = "mid_epoch"
    return {"seed": seed, "num_samples": n, "batch_size": batch_size, "drop_last": drop_last,
            "epochs": epochs, "interrupt": interrupt, "kind": kind}

# ---------------------------------------------------------------- amp and loss scaling
# Scales are float32 (the scaler's dtype): powers of two, arbitrary values, the subnormal
# floor and the float32 ceiling, where growth is capped (NOTE [ Scale update rounding ]).
def scaler_scales() -> st.SearchStrategy[float]:
    """Positive finite float32 scales: powers of two, random bit patterns, both extremes."""
    f32 = np.finfo(np.float32)
    return st.one_of(
        st.integers(-149, 127).map(lambda e: math.ldexp(1.0, e)),
        st.integers(1, 0x7F7FFFFF).map(
            lambda b: float(np.array(b, dtype=np.uint32).view(np.float32))),
        st.sampled_from([float(f32.max), float(f32.max) / 2, float(f32.smallest_subnormal),
                         2.0**16, 2.0**24]),
    )


def scaler_factors() -> st.SearchStrategy[tuple[float, float]]:
    """(growth_factor > 1, backoff_factor in (0, 1)): torch's defaults, powers of two, any."""
    return st.tuples(
        st.one_of(st.just(2.0), st.floats(1.0, 16.0, exclude_min=True)),
        st.one_of(st.just(0.5), st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
    )


def scaler_hyper() -> st.SearchStrategy[dict]:
    """GradScaler keyword arguments with non-power-of-two factors and short intervals."""
    return st.builds(
        lambda scale, factors, interval: {"init_scale": scale, "growth_factor": factors[0],
                                          "backoff_factor": factors[1],
                                          "growth_interval": interval},
        scaler_scales(), scaler_factors(), st.integers(1, 4))


def scaler_grad_stream(shapes: list[tuple[int, ...]]) -> st.SearchStrategy[list[np.ndarray]]:
    """One float32 gradient per shape: normals times 2^k (k in [-140, 70]), and with some
    probability a +inf, -inf or NaN planted in any of them."""

    def build(seed: int, k: int, plant: int, where: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        with np.errstate(over="ignore"):
            grads = [(rng.standard_normal(s) * 2.0**k).astype(np.float32) for s in shapes]
        if plant < 3:
            flat = grads[where % len(grads)].reshape(-1)
            flat[int(rng.integers(flat.size))] = (np.inf, -np.inf, np.nan)[plant]
        return grads

    return st.builds(build, st.integers(0, 2**32 - 1), st.integers(-140, 70),
                     st.integers(0, 5), st.integers(0, 7))


# ---------------------------------------------------------------- recompute
# Checkpointing schedules for a Sequential of n layers: every spec kind, with K over its
# whole range 1..n (K = 1: nothing checkpointed; K = n: every segment one layer) and S from 1
# (only the input stored: the quadratic extreme) to past n - 1 (every state storable).
RECOMPUTE_KINDS = ("none", "sqrt", "uniform", "optimal")


@st.composite
def recompute_specs(draw: st.DrawFn, n_layers: int) -> str:
    """A schedule spec valid for n_layers: "none", "sqrt", "uniform:K" or "optimal:S"."""
    kind = draw(st.sampled_from(RECOMPUTE_KINDS))
    if kind == "uniform":
        return f"uniform:{draw(st.integers(1, n_layers))}"
    if kind == "optimal":
        return f"optimal:{draw(st.integers(1, n_layers + 1))}"
    return kind


def recompute_models() -> st.SearchStrategy[dict]:
    """make_mlp arguments: 1-6 hidden layers (3-19 modules), dropout on or off, any activation."""
    return st.fixed_dictionaries({
        "sizes": st.lists(st.integers(1, 12), min_size=2, max_size=7),
        "activation": st.sampled_from(("relu", "tanh", "gelu_tanh", "gelu")),
        "dropout": st.sampled_from((0.0, 0.2, 0.5)),
        "dtype": st.sampled_from((np.float32, np.float64)),
        "batch": st.integers(1, 6),
        "seed": st.integers(0, 2**32 - 1),
    })


# ---------------------------------------------------------------- resume and train

# A training run interrupted once: a small config (the compact model on the teacher task),
# the total steps, the step the checkpoint is written at, and how often the interrupted
# half checkpoints (`every`; its last checkpoint is at `interrupt`). fp16 runs draw a huge
# initial loss scale half the time, so overflow-skipped steps fall before the interruption.
TRAIN_PRECISIONS = ("fp32", "bf16", "fp16")
TRAIN_RECOMPUTE = ("none", "sqrt", "uniform:2", "optimal:2")


@st.composite
def train_configs(draw: st.DrawFn, max_total: int = 10) -> dict:
    """{config (TrainConfig keywords), total, interrupt (1..total-1), every}."""
    precision = draw(st.sampled_from(TRAIN_PRECISIONS))
    config = {
        "seed": draw(st.integers(0, 2**16)),
        "sizes": (8, 16, 3),
        "dropout": draw(st.sampled_from([0.0, 0.25])),
        "precision": precision,
        "recompute": draw(st.sampled_from(TRAIN_RECOMPUTE)),
        "schedule": draw(st.sampled_from(["constant", "cosine", "step"])),
        "optimizer": draw(st.sampled_from(["SGD", "Adam", "AdamW"])),
        "total_steps": 8,
        "batch_size": 8,
        "num_samples": 24,  # 3 batches an epoch: interruptions fall mid-epoch and on edges
        "init_scale": draw(st.sampled_from([2.0**16, 2.0**22])) if precision == "fp16"
        else 2.0**16,
        "growth_interval": 3,
    }
    total = draw(st.integers(2, max_total))
    interrupt = draw(st.integers(1, total - 1))
    every = draw(st.integers(1, interrupt))
    return {"config": config, "total": total, "interrupt": interrupt, "every": every}
