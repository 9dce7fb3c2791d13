"""FP8 GEMMs with torch ops. See reference/fp8_gemm.py for the math.

The same public names in the same order, and `scaled_mm` adds what torch._scaled_mm takes
beyond the reference (bias, out_dtype, scale_result). What torch does differently or hides:

- `torch._scaled_mm` on CPU is an emulation in ATen (aten/src/ATen/native/Blas.cpp,
  `_scaled_mm_out_cpu_emulated`), and `scaled_mm` below is that kernel in torch ops, step
  for step: both operands made contiguous, widened to float32 and multiplied by their
  scales (`at::mul`, one float32 rounding each: NOTE [ Dequantize, then multiply ] in
  reference/fp8_gemm.py), `at::matmul` of the two in float32 (the same BLAS kernel as any
  float32 matmul), the bias added in float32, for an fp8 out_dtype the product multiplied
  by f32(1 / scale_result) (scale_result is ignored for other out_dtypes), and one cast to
  out_dtype. torch._scaled_mm's `use_fast_accum` is ignored on CPU (the twin has no such
  argument). Claim fp8_gemm.scaled_mm_cpu holds torch._scaled_mm to it bit for bit.
- Which torch has it, measured on CPU with torch 2.6.0, 2.7.1, 2.8.0, 2.11.0, 2.12.0,
  2.12.1 and 2.13.0 (mkldnn on and off): 2.6 and 2.7 have no CPU kernel
  (NotImplementedError); from 2.8 ("Add torch._scaled_mm for CPU", April 2025, and "Support
  fp8 output of _scaled_mm for CPU", May 2025) tensorwise scales, any out_dtype, fp8 outputs
  divided by scale_result; 2.8 and 2.11 refuse rowwise scales ((M, 1) and (1, N)) with a
  RuntimeError (an internal assert that both scales have one element); 2.12.0 (the
  scaled_mm_v2 series of spring 2026) and later take them. `cpu_scaled_mm_support` probes,
  it does not trust the version.
- On a CPU with AMX (int8 AMX for one fp8 dtype, fp16 AMX for mixed e4m3 x e5m2) and
  mkldnn enabled, `_scaled_mm` calls oneDNN's fp8 matmul (`mkldnn_scaled_mm`) instead,
  whose accumulation is oneDNN's own: not this emulation, and no claim here.
  `torch.backends.mkldnn.enabled = False` selects the emulation on any CPU.
- `mx_matmul` lays the operands out as torchao's MXTensor emulation does (a row-major,
  b column-major: b is quantized as b^T, row-major, and transposed back) and calls
  `torch.mm`, torchao's own `aten.mm` on the dequantized tensors.
"""

from __future__ import annotations

import torch

from common.arg_ranges import (
    GEMM_FORMATS,
    MATMUL_DTYPES,
    SCALE_DTYPES,
    check_broadcast,
    check_dtype,
    check_gemm_shapes,
    check_scale_shape,
)
from torch_impl import mx

# the declared ranges (common/arg_ranges.py): an operand's format, a scale's and a matmul's dtype
FP8_DTYPES = tuple(getattr(torch, name) for name in GEMM_FORMATS)


def _dtype_name(x: object) -> str:
    """The dtype's name as both trees write it ("float32", not "torch.float32"); for a
    non-tensor, what it is instead."""
    if not isinstance(x, torch.Tensor):
        return f"{type(x).__name__} (not a tensor)"
    return str(x.dtype).removeprefix("torch.")


def _check_fp8(x: object, where: str, name: str) -> torch.Tensor:
    check_dtype(where, name, _dtype_name(x), GEMM_FORMATS, TypeError)
    return x  # type: ignore[return-value]


def dequantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """f32(x * scale): fp8 x with its float32 dequantization scale (reference: the same)."""
    _check_fp8(x, "dequantize", "x")
    check_dtype("dequantize", "scale", _dtype_name(scale), SCALE_DTYPES, TypeError)
    check_broadcast("dequantize", "scale", tuple(scale.shape), tuple(x.shape))
    return x.contiguous().to(torch.float32) * scale


def matmul_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch's float32 matmul (the reference accumulates in float64 and rounds once)."""
    for name, m in (("a", a), ("b", b)):
        check_dtype("matmul_f32", name, _dtype_name(m), MATMUL_DTYPES, TypeError)
    check_gemm_shapes("matmul_f32", tuple(a.shape), tuple(b.shape))
    return torch.matmul(a, b)  # (M, N)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              *, bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32,
              scale_result: torch.Tensor | None = None) -> torch.Tensor:
    """torch._scaled_mm's CPU kernel in torch ops (module docstring): a (M, K), b (K, N)
    fp8; scales float32, one value each or (M, 1) and (1, N); bias (N,)."""
    a, b = _check_fp8(a, "scaled_mm", "a"), _check_fp8(b, "scaled_mm", "b")
    check_gemm_shapes("scaled_mm", tuple(a.shape), tuple(b.shape))
    for name, s, rowwise in (("scale_a", scale_a, (a.shape[0], 1)),
                             ("scale_b", scale_b, (1, b.shape[1]))):
        check_dtype("scaled_mm", name, _dtype_name(s), SCALE_DTYPES, TypeError)
        check_scale_shape("scaled_mm", name, tuple(s.shape), rowwise)
    sa = scale_a.reshape(()) if scale_a.numel() == 1 else scale_a
    sb = scale_b.reshape(()) if scale_b.numel() == 1 else scale_b
    out = matmul_f32(dequantize(a, sa), dequantize(b, sb))
    if bias is not None:
        out.add_(bias)
    if out_dtype in FP8_DTYPES and scale_result is not None:
        r = torch.tensor(1.0, dtype=torch.float32) / scale_result.to(torch.float32)
        out = out * r.item()  # C++ `1 / output_scale` in float, then at::mul by it
    return out.to(out_dtype)


def cpu_scaled_mm_support() -> tuple[bool, bool]:
    """(tensorwise, rowwise): whether this torch's `_scaled_mm` runs on CPU with each kind
    of scale (a probe on a 2 x 16 x 16 product: see the module docstring for versions)."""
    a = torch.ones(2, 16).to(torch.float8_e4m3fn)
    b = torch.ones(16, 16).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    found = []
    for sa, sb in ((one, one), (torch.ones(2, 1), torch.ones(1, 16))):
        try:
            torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
            found.append(True)
        except (RuntimeError, NotImplementedError, ValueError):
            found.append(False)
    return found[0], found[1]


def mx_matmul(a: torch.Tensor, b: torch.Tensor, fmt: str, mode: str = "floor",
              variant: str = "ocp") -> torch.Tensor:
    """The emulated MX product of float32 a (M, K) and b (K, N) (reference: the same)."""
    check_gemm_shapes("mx_matmul", tuple(a.shape), tuple(b.shape))
    a_hp = mx.from_mx(mx.to_mx(a, fmt, mode, variant=variant))  # (M, K), blocks along K
    b_hp = mx.from_mx(mx.to_mx(b.t().contiguous(), fmt, mode, variant=variant)).t()  # (K, N)
    return torch.mm(a_hp, b_hp)
