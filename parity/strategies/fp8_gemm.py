"""Strategies for the fp8_gemm claims: GEMM shapes (K from 1, not only the multiples of 16
the CUDA kernels need), operand formats, scale kinds and sign patterns."""

from __future__ import annotations

from hypothesis import strategies as st

from parity.drivers.fp8_gemm import FORMAT_PAIRS

GEMM_EDGES = ("k_one", "odd_k", "vector_out", "mixed_formats", "rowwise", "mixed_signs")


@st.composite
def fp8_gemm_cases(draw: st.DrawFn) -> tuple[dict, list[str]]:
    """(keyword arguments of parity.drivers.fp8_gemm.fp8_case, the edges they reach)."""
    m, n = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    k = draw(st.integers(1, 300))
    fmts = draw(st.sampled_from(FORMAT_PAIRS))
    rowwise, same_sign = draw(st.booleans()), draw(st.booleans())
    case = {"m": m, "k": k, "n": n, "fmts": fmts, "rowwise": rowwise,
            "seed": draw(st.integers(0, 2**32 - 1)), "same_sign": same_sign}
    edges = [name for name, hit in (
        ("k_one", k == 1), ("odd_k", k % 2 == 1), ("vector_out", min(m, n) == 1),
        ("mixed_formats", fmts[0] != fmts[1]), ("rowwise", rowwise),
        ("mixed_signs", not same_sign)) if hit]
    return case, edges
