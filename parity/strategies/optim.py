"""Hypothesis strategies for optim (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from common.arg_ranges import (
    ADAM_BETAS,
    ADAM_EPSILONS,
    ADAM_LRS,
    ADAM_WEIGHT_DECAYS,
    SGD_LRS,
    SGD_MOMENTA,
    SGD_WEIGHT_DECAYS,
)
from parity.strategies.edges import declared_values

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


# float32 inputs of stochastic rounding to bfloat16, by the bits that make each an edge: the
# rule reads only the low 16 bits (what bfloat16 drops) and the carry into the upper 16
SR_EDGES: dict[str, tuple[int, ...]] = {
    "exact bf16 values (never move)": (0x3F800000, 0xBF800000, 0x00000000, 0x80000000,
                                       0x7F7F0000, 0x00010000),
    "ties (low = 0x8000, p = 1/2)": (0x3F808000, 0xBF808000, 0x3F818000),
    "one draw from either end": (0x3F800001, 0x3F80FFFF, 0xBF800001, 0xBF80FFFF),
    "carry into the exponent": (0x3FFFFFFF, 0xBFFFFFFF, 0x007FFFFF),
    "subnormals": (0x00000001, 0x80000001, 0x0000FFFF, 0x00008000, 0x807FFFFF),
    "largest finite float32 (up is inf)": (0x7F7FFFFF, 0xFF7FFFFF),
    "infinities": (0x7F800000, 0xFF800000),
    "NaN": (0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC08000),
}


def sr_edge_bits() -> np.ndarray:
    """Every SR_EDGES entry once, as uint32 float32 bit patterns."""
    return np.array([b for group in SR_EDGES.values() for b in group], dtype=np.uint32)


def sr_bf16_inputs() -> st.SearchStrategy[np.ndarray]:
    """float32 bit patterns (uint32, up to 64) of any class: uniform bits reach every binade,
    NaN and inf, with the edges of SR_EDGES mixed in."""
    word = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(list(sr_edge_bits())))
    return st.lists(word, min_size=1, max_size=64).map(lambda w: np.array(w, dtype=np.uint32))


def optim_declared_hyper(name: str) -> st.SearchStrategy[dict]:
    """Keyword arguments of SGD, Adam or AdamW, each hyperparameter drawn over the whole of
    its declared range (common/arg_ranges.py: torch's own checks), its edges often: 0 and
    inf where torch takes them, betas up to the float just below 1 (`name` SGD, Adam or
    AdamW)."""
    if name == "SGD":
        return st.fixed_dictionaries({"lr": declared_values(SGD_LRS),
                                      "momentum": declared_values(SGD_MOMENTA),
                                      "weight_decay": declared_values(SGD_WEIGHT_DECAYS)})
    return st.fixed_dictionaries({
        "lr": declared_values(ADAM_LRS), "eps": declared_values(ADAM_EPSILONS),
        "betas": st.tuples(declared_values(ADAM_BETAS), declared_values(ADAM_BETAS)),
        "weight_decay": declared_values(ADAM_WEIGHT_DECAYS)})
