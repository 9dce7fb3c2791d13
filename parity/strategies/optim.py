"""Hypothesis strategies for optim (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

import math

from hypothesis import strategies as st

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
