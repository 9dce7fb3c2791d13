"""The scale S of the fp8_gemm eps claims (parity/claims/fp8_gemm.py), in units of float32
eps, so that each claim is |y_ref - y_torch| <= eps S elementwise (bound 1).

NOTE [ GEMM error budget ]
Both sides multiply the SAME float32 operands A (M, K) and B (K, N): the dequantized fp8
codes (claim fp8_gemm.dequantize) or the dequantized MX blocks (claim mx.twins), bit for
bit. Let E = A @ B exactly and P = |A| @ |B| (elementwise absolute values). Then, with
u = 2^-24 (float32's unit roundoff), v = 2^-53 (float64's) and gamma_K(u) = K u / (1 - K u)
(Higham, Accuracy and Stability, Lemma 3.1 and (3.5)):

    torch  (float32 BLAS, any order, FMA or not)   |y_t - E| <= gamma_K(u) P
    ref    (float64 sum of exact products,         |y_r - E| <= u |E'| + |E' - E|
            rounded once: reference/fp8_gemm.py)             <= (u + gamma_K(v) (1 + u)) P
                                                   (E' the float64 sum, |E| <= P)
    so     |y_r - y_t| <= (gamma_K(u) + u + gamma_K(v) (1 + u)) P = eps S,   eps = 2u.

No term is probabilistic: this is the worst case over every summation order a BLAS may
choose (blocked, SIMD lanes, split K), which is why it is loose for a sum of mixed signs,
where |E| << P. The tests choose operands where it is exercised: same-sign operands (every
partial sum grows, so every rounding error counts against P) and a short K (the worst case
grows as K, the typical blocked error does not); they assert the observed worst case is
above 1/100 of S.
"""

from __future__ import annotations

import numpy as np

U32 = float.fromhex("0x1p-24")  # float32 unit roundoff
U64 = float.fromhex("0x1p-53")  # float64 unit roundoff
EPS32 = float.fromhex("0x1p-23")  # float32 machine epsilon, the eps of the claims


def gamma(k: int, u: float) -> float:
    """gamma_k = k u / (1 - k u): the bound on |theta_k| of k roundings (k u < 1)."""
    if k * u >= 1:
        raise ValueError(f"gamma: k u = {k * u} >= 1; no bound for a {k}-term sum")
    return k * u / (1 - k * u)


def gemm_scale(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """S (M, N) of NOTE [ GEMM error budget ] for float32 operands a (M, K), b (K, N)."""
    k = a.shape[1]
    p = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))  # |A| |B|
    c = gamma(k, U32) + U32 + gamma(k, U64) * (1 + U32)
    return c * p / EPS32
