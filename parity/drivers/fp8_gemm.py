"""fp8 and MX GEMMs in both trees on the same operands, and the operands themselves.

fp8 operands (`fp8_case`) are cast the way a training step casts them: current scaling
(reference.fp8_scaling, tensorwise or rowwise: a's rows, b's columns), the dequantization
scale the float32 reciprocal of the cast scale, as torchao hands torch._scaled_mm. b is
built as b^T (N, K) row-major and transposed, the column-major layout _scaled_mm's CUDA
kernels require (the CPU emulation takes any layout). The values are same-sign by default:
NOTE [ GEMM error budget ] (parity/claims/fp8_gemm_bounds.py) says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

from parity.claims.fp8_gemm_bounds import gemm_scale
from reference import fp8_gemm as rgemm
from reference import fp8_scaling as rfp8
from torch_impl import fp8_gemm as tgemm
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
              torch.float8_e5m2)
GEMM_K = (32, 64, 256)  # short K: where the worst-case bound is exercised


@dataclass(frozen=True)
class Fp8Case:
    """a (M, K) and b (K, N) as ml_dtypes fp8, their float32 dequantization scales."""

    a: np.ndarray
    b: np.ndarray
    scale_a: np.ndarray  # () or (M, 1)
    scale_b: np.ndarray  # () or (1, N)


def fp8_case(m: int, k: int, n: int, fmts: tuple[str, str], rowwise: bool, seed: int,
             same_sign: bool = True) -> Fp8Case:
    """Operands from float32 values |x| in [2^-6, 2^6) (log-uniform), cast by current
    scaling; same_sign=False gives them random signs."""
    rng = np.random.default_rng(seed)
    xs = []
    for shape in ((m, k), (k, n)):
        x = np.exp2(rng.uniform(-6, 6, shape))
        if not same_sign:
            x *= rng.choice([-1.0, 1.0], shape)
        xs.append(x.astype(np.float32))
    qa, sa = rfp8.current_scaling(xs[0], fmts[0], axis=1 if rowwise else None)  # (M, 1)
    qb, sb = rfp8.current_scaling(xs[1], fmts[1], axis=0 if rowwise else None)  # (1, N)
    one = np.float32(1)
    return Fp8Case(qa, qb, np.asarray(one / sa, np.float32), np.asarray(one / sb, np.float32))


def to_torch_fp8(x: np.ndarray) -> torch.Tensor:
    """An ml_dtypes fp8 array as the torch fp8 tensor with the same bits."""
    fmt = {np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn",
           np.dtype(ml_dtypes.float8_e5m2): "float8_e5m2"}[x.dtype]
    return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(TORCH_DTYPES[fmt])


def torch_operands(case: Fp8Case) -> tuple[torch.Tensor, ...]:
    """(a, b, scale_a, scale_b) for torch, b column-major (b^T row-major, transposed)."""
    a = to_torch_fp8(case.a)
    b = to_torch_fp8(np.ascontiguousarray(case.b.T)).t()  # (K, N), column-major
    return a, b, torch.from_numpy(case.scale_a.copy()), torch.from_numpy(case.scale_b.copy())


def dequantized(case: Fp8Case) -> tuple[np.ndarray, np.ndarray]:
    """The reference's float32 operands A, B (claim fp8_gemm.dequantize: torch's too)."""
    return rgemm.dequantize(case.a, case.scale_a), rgemm.dequantize(case.b, case.scale_b)


def both_scaled_mm(case: Fp8Case) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
    """(reference.scaled_mm, torch_impl.scaled_mm, S of fp8_gemm.reference), float32 out."""
    ref = rgemm.scaled_mm(case.a, case.b, case.scale_a, case.scale_b)
    tor = tgemm.scaled_mm(*torch_operands(case))
    return ref, tor, gemm_scale(*dequantized(case))


def mx_operands(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive float32 a (M, K) and b (K, N) whose 32-blocks along K have magnitudes
    2^j, j uniform in [-12, 12] per block (one magnitude would leave fp6/fp4 sums exact)."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1.0, (m, k)) * np.exp2(rng.integers(-12, 13, (m, k // 32, 1))
                                                ).repeat(32, axis=2).reshape(m, k)
    bt = rng.uniform(0.5, 1.0, (n, k)) * np.exp2(rng.integers(-12, 13, (n, k // 32, 1))
                                                 ).repeat(32, axis=2).reshape(n, k)
    return a.astype(np.float32), np.ascontiguousarray(bt.T.astype(np.float32))


def both_mx_matmul(a: np.ndarray, b: np.ndarray, fmt: str, mode: str
                   ) -> tuple[np.ndarray, torch.Tensor, np.ndarray]:
    """(reference.mx_matmul, torch_impl.mx_matmul, S of fp8_gemm.mx_twins)."""
    ref = rgemm.mx_matmul(a, b, fmt, mode)
    tor = tgemm.mx_matmul(torch.from_numpy(a), torch.from_numpy(b), fmt, mode)
    a_hp = rgemm.mx.from_mx(rgemm.mx.to_mx(a, fmt, mode))
    b_hp = rgemm.mx.from_mx(rgemm.mx.to_mx(np.ascontiguousarray(b.T), fmt, mode)).T
    return ref, tor, gemm_scale(a_hp, b_hp)
