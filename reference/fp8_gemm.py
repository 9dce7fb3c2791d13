"""FP8 GEMMs: a scaled fp8 matrix product, and an MX matrix product, from the codes.

An fp8 GEMM multiplies two fp8 matrices a (M, K) and b (K, N) that carry float32
*dequantization* scales (the reciprocals of the cast scales of reference/fp8_scaling.py:
a's real value is a_ik * sa), tensorwise (one scalar each) or rowwise (sa of shape (M, 1),
sb of shape (1, N): one per output row and column, so both factor out of the dot product):

    A = f32(decode(a) * sa)           (M, K)   one float32 rounding per element
    B = f32(decode(b) * sb)           (K, N)
    Y = f32(sum_k A_ik B_kj)          (M, N)   the dot product, rounded once to float32

NOTE [ Dequantize, then multiply ]
The scale is applied to each operand before the product, not to the product: torch's CPU
`_scaled_mm` computes exactly A @ B in float32 (torch_impl/fp8_gemm.py), which is not
(decode(a) @ decode(b)) * (sa * sb): f32(d * sa) rounds each operand (an fp8 value has at
most 4 significant bits, sa up to 24, so the product needs up to 28), where scaling the
product rounds once at the end. Both are rounding-faithful to the same real number, and
differ in the last bits of most outputs (claim fp8_gemm.scaled_mm_cpu counts them). cuBLASLt's
fp8 GEMMs apply the scales to the float32 accumulator, the second form: which one a kernel
takes is part of its numerics, and the reference takes the CPU's.

NOTE [ Accumulate in float64, round once ]
The dot product is accumulated in float64 and rounded once to float32. A float32 x float32
product is exact in float64 (24 + 24 significant bits <= 53), so the only errors are
float64's additions, gamma_K(2^-53) sum |A_ik B_kj| (Higham, Accuracy and Stability, 3.1),
and the final rounding, half a float32 ulp of Y. The reference is thus within a hair of the
correctly rounded float32 product, independently of any BLAS blocking, and a float32 GEMM
(which rounds K times, in an order of its own: |fl(A.B) - A.B| <= gamma_K(2^-24) |A|.|B|)
is held to it by the derived bound of claim fp8_gemm.reference (parity/claims/
fp8_gemm_bounds.py). A float32 reference would be a second float32 GEMM in another order:
two errors of size gamma_K to bound instead of one.

An MX GEMM (OCP Microscaling 1.0, emulated): both operands are quantized to MX along the
contraction dimension K (a's rows, b's columns: blocks of 32 consecutive k), dequantized
(reference/mx.py's from_mx, exact: a code times a power of two) and multiplied as above:

    Y = f32(sum_k from_mx(to_mx(a))_ik from_mx(to_mx(b^T))_jk)

the emulation torchao's MXTensor runs for `mm` when no MX kernel is used.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from common.arg_ranges import (
    GEMM_FORMATS,
    MATMUL_DTYPES,
    SCALE_DTYPES,
    check_broadcast,
    check_dtype,
    check_gemm_shapes,
    check_scale_shape,
)
from reference import mx
from reference.formats import decode

# the declared ranges (common/arg_ranges.py): an operand's format, a scale's and a matmul's dtype
FP8_FORMATS = {name: getattr(ml_dtypes, name) for name in GEMM_FORMATS}


def _dtype_name(x: np.ndarray) -> str:
    """The dtype's name as both trees write it ("float32", "float8_e4m3fn")."""
    return x.dtype.name


def _fmt_of(x: np.ndarray, where: str, name: str) -> str:
    return check_dtype(where, name, _dtype_name(x), GEMM_FORMATS, TypeError)


def _scale(scale: object, shape: tuple[int, ...], where: str, name: str) -> np.ndarray:
    """The float32 dequantization scale: one value, or `shape` (rowwise)."""
    s = np.asarray(scale)
    check_dtype(where, name, _dtype_name(s), SCALE_DTYPES, TypeError)
    check_scale_shape(where, name, s.shape, shape)
    return s.reshape(()) if s.size == 1 else s


def dequantize(x: np.ndarray, scale: object) -> np.ndarray:
    """f32(decode(x) * scale): fp8 x (ml_dtypes) with its float32 dequantization scale
    (a float32 array broadcasting to x's shape), as float32."""
    x, s = np.asarray(x), np.asarray(scale)
    fmt = _fmt_of(x, "dequantize", "x")
    check_dtype("dequantize", "scale", _dtype_name(s), SCALE_DTYPES, TypeError)
    check_broadcast("dequantize", "scale", s.shape, x.shape)
    codes = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape)  # a 0-d x stays 0-d
    values = decode(codes, fmt, dtype=np.float32)  # exact: every fp8 value is a float32
    return values * s  # one float32 rounding each


def matmul_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """f32(A @ B) of float32 A (M, K), B (K, N): accumulated in float64, rounded once
    (NOTE [ Accumulate in float64, round once ])."""
    for name, m in (("a", a), ("b", b)):
        check_dtype("matmul_f32", name, _dtype_name(m), MATMUL_DTYPES, TypeError)
    check_gemm_shapes("matmul_f32", a.shape, b.shape)
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)  # (M, N)


def scaled_mm(a: np.ndarray, b: np.ndarray, scale_a: object, scale_b: object) -> np.ndarray:
    """f32(A @ B), A = f32(decode(a) sa), B = f32(decode(b) sb) (module docstring).

    a: fp8 (M, K), b: fp8 (K, N) (ml_dtypes float8_e4m3fn or float8_e5m2, mixed allowed);
    scale_a, scale_b: float32, one value each or rowwise (M, 1) and (1, N). Returns float32
    (M, N). TypeError for another dtype, ValueError for shapes that do not fit.
    """
    a, b = np.asarray(a), np.asarray(b)
    _fmt_of(a, "scaled_mm", "a")
    _fmt_of(b, "scaled_mm", "b")
    check_gemm_shapes("scaled_mm", a.shape, b.shape)
    (m, _), (_, n) = a.shape, b.shape
    sa = _scale(scale_a, (m, 1), "scaled_mm", "scale_a")
    sb = _scale(scale_b, (1, n), "scaled_mm", "scale_b")
    return matmul_f32(dequantize(a, sa), dequantize(b, sb))


def mx_matmul(a: np.ndarray, b: np.ndarray, fmt: str, mode: str = "floor",
              variant: str = "ocp") -> np.ndarray:
    """The emulated MX product of float32 a (M, K) and b (K, N): both quantized to MX along
    K (block size 32, element format `fmt`, scale mode `mode`, `variant`: reference/mx.py),
    dequantized, and multiplied by `matmul_f32`. Returns float32 (M, N)."""
    a, b = np.asarray(a), np.asarray(b)
    check_gemm_shapes("mx_matmul", a.shape, b.shape)
    a_hp = mx.from_mx(mx.to_mx(a, fmt, mode, variant=variant))  # (M, K), blocks along K
    b_hp = mx.from_mx(mx.to_mx(np.ascontiguousarray(b.T), fmt, mode, variant=variant)).T
    return matmul_f32(a_hp, b_hp)
