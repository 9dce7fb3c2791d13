"""The scale S of claim fp8_blockwise.gemm_bound (parity/claims/fp8_blockwise.py), in units
of float64 eps (the float32 Y is compared in float64, where it is exact, with a float64
truth), so that the claim is |Y - E64| <= eps S elementwise (bound 1).

NOTE [ Blockwise GEMM error budget ]
Y is reference/fp8_blockwise_gemm.py's blockwise_mm of codes a (M, K), b (K, N) with decode
scales sa (per 1x128 tile) and sb (per 128x128 tile). The dequantized operands, exactly:
A_ik = decode(a_ik) sa_i,c(k) and B_kj = decode(b_kj) sb_c(k),j(j) (an e4m3 value has at most
4 significant bits and a float32 scale 24, so float64 holds each exactly). Let E = A @ B
exactly, P = |A| @ |B|, C = ceil(K / 128) chunks, u = 2^-24, v = 2^-53 and gamma_n(u) =
n u / (1 - n u) (Higham, Accuracy and Stability, Lemma 3.1; (1 + theta_j)(1 + theta_k) =
1 + theta_{j+k}, Lemma 3.3). Per chunk c, with P_c its exact sum (NOTE [ The chunk sum is
exact ]) and T_c = sa sb P_c its exact scaled value:

    p_c = f32(P_c)            = P_c (1 + d1)
    s_c = f32(sa sb)          = sa sb (1 + d2)
    t_c = f32(s_c p_c)        = T_c (1 + theta_3)           |d_i| <= u, no underflow
    Y   = t_0 + t_1 + ...     each of the C - 1 float32 additions rounds once (0 + t_0 is
                              exact), so Y = sum_c t_c (1 + theta_{C-1})        (Higham 3.1)
        = sum_c T_c (1 + theta_{C+2})
    |Y - E| <= gamma_{C+2}(u) sum_c |T_c| <= gamma_{C+2}(u) P       (|P_c| <= its |products|)

The truth the claim compares with is E64 = A @ B in float64 (the products rounded to float64,
summed in BLAS's order): |E64 - E| <= gamma_K(v) P. So

    |Y - E64| <= (gamma_{C+2}(u) + gamma_K(v)) P = eps S,    eps = 2v = 2^-52.

A kernel that fuses the scale and the add (DeepGEMM's `accum += scale * p` under nvcc's
default contraction) rounds once less per chunk and stays within it. No term is
probabilistic. The bound grows with C, not K: the promotion's point. Without it (one float32
accumulator over all K) the bound would be gamma_K(u) P, 128 times larger; with a chunk of
64 instead of 128, (2C + 2) u. The tests reach it with same-sign operands (every partial sum
grows, so each rounding counts against P) and few chunks (C = 2: the bound is gamma_4(u),
four roundings, of which a single output's error often spends two or three).
"""

from __future__ import annotations

import numpy as np

from parity.claims.fp8_gemm_bounds import U32, U64, gamma

EPS64 = float.fromhex("0x1p-52")  # float64 machine epsilon, the eps of the claim
CHUNK = 128  # the promotion interval of the GEMM, written here, not read from the trees


def dequantized_exact(codes: np.ndarray, scales: np.ndarray, tile: tuple[int, int]
                      ) -> np.ndarray:
    """decode(codes) * scale per tile, float64, exact (4 + 24 significant bits)."""
    q = np.asarray(codes).astype(np.float64)
    r, c = min(tile[0], q.shape[0]), min(tile[1], q.shape[1])
    per = np.repeat(np.repeat(np.asarray(scales, np.float64), r, axis=0), c, axis=1)
    return q * per[: q.shape[0], : q.shape[1]]


def blockwise_gemm_truth(a_codes: np.ndarray, a_scales: np.ndarray, b_codes: np.ndarray,
                         b_scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E64, S): the float64 product of the exactly dequantized operands, and the scale S
    (M, N) of NOTE [ Blockwise GEMM error budget ]."""
    a = dequantized_exact(a_codes, a_scales, (1, CHUNK))  # (M, K)
    b = dequantized_exact(b_codes, b_scales, (CHUNK, CHUNK))  # (K, N)
    k = a.shape[1]
    chunks = -(-k // CHUNK)
    c = gamma(chunks + 2, U32) + gamma(k, U64)
    return a @ b, c * (np.abs(a) @ np.abs(b)) / EPS64
