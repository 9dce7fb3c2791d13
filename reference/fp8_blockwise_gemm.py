"""The blockwise fp8 GEMM: DeepGEMM's product of 1x128-tiled activations and 128x128-tiled
weights, with the partial sums promoted to float32 every 128 elements of K.

DeepSeek-V3 (arXiv:2412.19437, section 3.3.2, "Increasing Accumulation Precision"): the
tensor cores accumulate fp8 products in limited precision, so "once an interval of N_C is
reached, these partial results will be copied to FP32 registers on CUDA Cores, where
full-precision FP32 accumulation is performed", with N_C = 128 elements, and "the scaling
factors ... can be efficiently multiplied on the CUDA Cores as the dequantization process".
DeepGEMM's kernel (deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh, commit
54e22612409371d6364144b69086735beb54e98b, lines 333-346) does, per K-block of 128:

    float scale_0_0 = scale_a_0 * scale_b_0;
    shifted_accum[i * 4 + 0] += scale_0_0 * accum[i * 4 + 0];

a (M, K): float8_e4m3fn codes with float32 decode scales a_scales (M, ceil(K / 128)), one per
row per 128 columns (reference/fp8_blockwise.py's 1x128 tiles); b (K, N): codes with scales
b_scales (ceil(K / 128), ceil(N / 128)), one per 128x128 block. For each chunk c of K
(columns 128c .. 128c + 127 of a, the same rows of b; the last chunk may be shorter):

    P_c = sum_{k in c} decode(a_ik) decode(b_kj)      exact (NOTE [ The chunk sum is exact ])
    p_c = f32(P_c)                                    one rounding: the promotion
    s_c = f32(a_scales[i, c] * b_scales[c, j // 128]) DeepGEMM's scale_a * scale_b
    y   = f32(y + f32(s_c * p_c))                     y starts at 0; c in increasing order

NOTE [ The chunk sum is exact ]
An e4m3 value is a multiple of 2^-9 (the smallest subnormal) below 2^9, with at most 4
significant bits; a product of two is a multiple of 2^-18 below 2^18, and any sum of 128 of
them a multiple of 2^-18 below 2^25: 43 bits, which float64 holds exactly, in any order of
addition. So the chunk's float64 matmul is the exact P_c whatever BLAS does, and the trees
agree on it bit for bit; a NaN code makes a NaN. This is the clean model of the promotion:
the chunk exact, rounded to float32 once. The Hopper tensor core's own accumulator keeps
fewer bits (DeepSeek-V3, 3.3.2: "limited to retaining around 14 bits", measured by them, not
specified by NVIDIA), which is not emulated here: its error is the kernel's, not the recipe's.

NOTE [ Scale, then add: two roundings ]
DeepGEMM's `accum += scale * p` is written as a multiply and an add; nvcc contracts it to a
fused multiply-add by default (--fmad=true), one rounding where this takes two. The
unfused form is the one NumPy and torch compute elementwise in the same order on any device,
so the trees agree bit for bit; an FMA can only remove a rounding, so the error bound of
claim fp8_blockwise.gemm_bound holds for the kernel too (parity/claims/
fp8_blockwise_bounds.py), though not its bits.
"""

from __future__ import annotations

import numpy as np
from ml_dtypes import float8_e4m3fn

CHUNK = 128  # N_C: K elements per promotion, and the K side of both operands' tiles


def blockwise_mm(a_codes: np.ndarray, a_scales: np.ndarray, b_codes: np.ndarray,
                 b_scales: np.ndarray) -> np.ndarray:
    """Y (M, N) float32 = a @ b by the module docstring's rule: per chunk of 128 along K, the
    exact product of codes rounded to float32, times f32(a_scale * b_scale), added to a
    float32 sum."""
    m, k, n = _check(a_codes, a_scales, b_codes, b_scales)
    a = np.asarray(a_codes).astype(np.float64)  # (M, K) exact
    b = np.asarray(b_codes).astype(np.float64)  # (K, N) exact
    b_cols = np.repeat(np.asarray(b_scales, np.float32), CHUNK, axis=1)[:, :n]  # (K/128, N)
    y = np.zeros((m, n), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and NaN codes: NaN
        for c in range(-(-k // CHUNK)):
            ks = slice(c * CHUNK, (c + 1) * CHUNK)
            p = (a[:, ks] @ b[ks, :]).astype(np.float32)  # (M, N): exact, then f32
            s = np.asarray(a_scales, np.float32)[:, c : c + 1] * b_cols[c : c + 1, :]  # (M, N)
            y = y + s * p
    return y


def _check(a_codes: object, a_scales: object, b_codes: object, b_scales: object
           ) -> tuple[int, int, int]:
    """(M, K, N); one line naming blockwise_mm for anything else (the same in both trees)."""
    for name, codes in (("a_codes", a_codes), ("b_codes", b_codes)):
        dtype = getattr(codes, "dtype", type(codes).__name__)
        if dtype != float8_e4m3fn:
            raise TypeError(f"blockwise_mm: {name} must be float8_e4m3fn, got {dtype}")
    for name, scales in (("a_scales", a_scales), ("b_scales", b_scales)):
        dtype = getattr(scales, "dtype", type(scales).__name__)
        if dtype != np.float32:
            raise TypeError(f"blockwise_mm: {name} must be float32, got {dtype}")
    return _check_shapes(np.shape(a_codes), np.shape(a_scales), np.shape(b_codes),
                        np.shape(b_scales))


def _check_shapes(a: tuple[int, ...], sa: tuple[int, ...], b: tuple[int, ...],
                 sb: tuple[int, ...]) -> tuple[int, int, int]:
    """(M, K, N) of codes a (M, K), b (K, N) and their scale grids; ValueError in one line."""
    if len(a) != 2 or len(b) != 2 or 0 in a or 0 in b:
        raise ValueError(f"blockwise_mm: a_codes and b_codes must be non-empty matrices, got "
                         f"{tuple(a)} and {tuple(b)}")
    (m, k), (k_b, n) = a, b
    if k != k_b:
        raise ValueError(f"blockwise_mm: a_codes is (M, K) = {tuple(a)} and b_codes (K, N) = "
                         f"{tuple(b)}: K differs")
    grid_k, grid_n = -(-k // CHUNK), -(-n // CHUNK)
    if tuple(sa) != (m, grid_k):
        raise ValueError(f"blockwise_mm: a_scales must be (M, ceil(K / 128)) = {(m, grid_k)} "
                         f"for a's 1x128 tiles, got {tuple(sa)}")
    if tuple(sb) != (grid_k, grid_n):
        raise ValueError(f"blockwise_mm: b_scales must be (ceil(K / 128), ceil(N / 128)) = "
                         f"{(grid_k, grid_n)} for b's 128x128 tiles, got {tuple(sb)}")
    return m, k, n
