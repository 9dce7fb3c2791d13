"""The blockwise fp8 GEMM with PyTorch's native API. See reference/fp8_blockwise_gemm.py for
the math (DeepGEMM's promotion every 128 elements of K, its source, NOTE [ The chunk sum is
exact ], NOTE [ Scale, then add: two roundings ]); same public names, same order.
What PyTorch does differently or hides:

- torch's fp8 matmul (`torch._scaled_mm`) takes one scale per row or per tensor and
  accumulates all of K at once: it is not this GEMM. So each chunk is an explicit float64
  `torch.mm` of the decoded codes (`.to(torch.float64)`, exact), rounded to float32 by
  `.to(torch.float32)`; any order of that matmul's additions gives the same exact sum.
- The scale product, the scaling and the running sum are separate float32 tensor ops, each
  one IEEE rounding on CPU and CUDA alike (no kernel fuses `y + s * p` here).
Works on CPU and CUDA tensors alike.
"""

from __future__ import annotations

import torch

CHUNK = 128


def blockwise_mm(a_codes: torch.Tensor, a_scales: torch.Tensor, b_codes: torch.Tensor,
                 b_scales: torch.Tensor) -> torch.Tensor:
    """Y (M, N) float32 = a @ b, promoted to float32 every 128 elements of K."""
    m, k, n = _check(a_codes, a_scales, b_codes, b_scales)
    a = a_codes.to(torch.float64)  # (M, K) exact
    b = b_codes.to(torch.float64)  # (K, N) exact
    b_cols = b_scales.repeat_interleave(CHUNK, dim=1)[:, :n]  # (K/128, N)
    y = torch.zeros((m, n), dtype=torch.float32, device=a_codes.device)
    for c in range(-(-k // CHUNK)):
        ks = slice(c * CHUNK, (c + 1) * CHUNK)
        p = (a[:, ks] @ b[ks, :]).to(torch.float32)  # (M, N): exact, then f32
        s = a_scales[:, c : c + 1] * b_cols[c : c + 1, :]  # (M, N)
        y = y + s * p
    return y


def _check(a_codes: object, a_scales: object, b_codes: object, b_scales: object
           ) -> tuple[int, int, int]:
    """(M, K, N); one line naming blockwise_mm for anything else (the reference's lines)."""
    for name, codes, want in (("a_codes", a_codes, torch.float8_e4m3fn),
                              ("b_codes", b_codes, torch.float8_e4m3fn),
                              ("a_scales", a_scales, torch.float32),
                              ("b_scales", b_scales, torch.float32)):
        if not isinstance(codes, torch.Tensor) or codes.dtype != want:
            what = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise TypeError(f"blockwise_mm: {name} must be {str(want).removeprefix('torch.')}, "
                            f"got {str(what).removeprefix('torch.')}")
    return _check_shapes(tuple(a_codes.shape), tuple(a_scales.shape), tuple(b_codes.shape),
                         tuple(b_scales.shape))


def _check_shapes(a: tuple[int, ...], sa: tuple[int, ...], b: tuple[int, ...],
                  sb: tuple[int, ...]) -> tuple[int, int, int]:
    """(M, K, N) of codes a (M, K), b (K, N) and their scale grids (reference: the same)."""
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
