"""The fp8_gemm claims (the kinds and the registry: parity/tolerances.py; the GEMM bound:
parity/claims/fp8_gemm_bounds.py).

torch._scaled_mm on CPU is the oracle of the fp8 GEMM (parity/test_fp8_gemm.py, gated on
a torch that has the CPU kernel: torch_impl/fp8_gemm.py says which); torchao 0.18's MXTensor
`mm` (its emulated path, the only one on CPU) that of the MX GEMM (parity/
test_fp8_gemm_torchao.py). All of it is CPU: on CUDA _scaled_mm is cuBLASLt, which scales
the accumulator instead (NOTE [ Dequantize, then multiply ] in reference/fp8_gemm.py).
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

_GEMM_REASON = (
    "Both sides multiply the same float32 operands (fp8_gemm.dequantize, mx.twins); torch's "
    "float32 BLAS is within gamma_K(2^-24) |A||B| of the exact product in any summation "
    "order, the reference (float64 sum of exact products, rounded once) within 2^-24 + "
    "gamma_K(2^-53) of it: S = (gamma_K(2^-24) + 2^-24 + gamma_K(2^-53)(1 + 2^-24)) |A||B| "
    "/ eps (NOTE [ GEMM error budget ]). The worst case over orders: the tests use same-sign "
    "operands and K of 32 to 256, where the observed worst case is above 1/100 of S (they "
    "assert it)."
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fp8_gemm.scaled_mm_cpu",
        statement=(
            "On CPU (the emulated kernel: no AMX, or mkldnn disabled), torch._scaled_mm gives "
            "the bits of torch_impl.fp8_gemm.scaled_mm: f32(a * sa) @ f32(b * sb) in "
            "torch's float32 matmul, plus bias, times f32(1 / scale_result) for an fp8 "
            "out_dtype, cast to out_dtype; for float8_e4m3fn, float8_e5m2 and mixed "
            "operands, tensorwise and rowwise scales, with and without bias, every "
            "out_dtype (float32, bfloat16, float16, both fp8), use_fast_accum either way, "
            "and float32 out for any shape under hypothesis. "
            "Scaling the product instead, (a @ b) * (sa * sb), gives other bits in most "
            "outputs (the test asserts more than half differ)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The same torch operations in the same order (ATen's _scaled_mm_out_cpu_emulated: "
            "contiguous, to(float32), at::mul by the scale, at::matmul, add_(bias), "
            "at::mul(1 / scale_result), to(out_dtype)), each deterministic on CPU; the "
            "matmul is the same BLAS call on the same float32 operands. Scaling the product "
            "rounds once at the end instead of once per operand: another real number's "
            "rounding (NOTE [ Dequantize, then multiply ])."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fp8_gemm.dequantize",
        statement=(
            "reference.fp8_gemm.dequantize, f32(decode(code) * scale) from the codes by "
            "reference.formats.decode, gives torch's f32(x.to(float32) * scale) for all 256 "
            "codes of float8_e4m3fn and float8_e5m2, tensorwise and rowwise scales (normal, "
            "subnormal-producing, power-of-two and overflowing), NaN as a class."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Every fp8 value is a float32 value (decode is exact, and so is torch's widening "
            "cast), and the float32 product is rounded once, correctly, by IEEE 754 on both "
            "sides; a NaN code or an overflow to inf is the same class on both."
        ),
    ),
    Claim(
        id="fp8_gemm.reference",
        statement=(
            "reference.fp8_gemm.scaled_mm (float64 accumulation, one rounding) is within the "
            "derived bound of torch._scaled_mm (where the CPU kernel exists) and of "
            "torch_impl.fp8_gemm.scaled_mm, float32 out, tensorwise and rowwise scales, "
            "e4m3, e5m2 and mixed operands, K = 32, 64, 256, and under hypothesis any shape "
            "up to 12 x 300 x 12 (K = 1 and odd K included)."
        ),
        kind="eps",
        bound=1.0,
        scale="(gamma_K(u) + u + gamma_K(2^-53)(1 + u)) |A||B| / eps, u = 2^-24",
        reason=_GEMM_REASON,
    ),
    Claim(
        id="fp8_gemm.mx_twins",
        statement=(
            "reference.fp8_gemm.mx_matmul and torch_impl.fp8_gemm.mx_matmul (both operands to "
            "MX along K, dequantized, multiplied: the reference in float64 rounded once, "
            "torch in float32) agree within the derived bound for every MX element format "
            "(float8_e4m3fn, float8_e5m2, fp6 e2m3 and e3m2, fp4 e2m1), floor and rceil_log2f "
            "scales, on blocks whose magnitudes span 2^-12 .. 2^12; their dequantized "
            "operands are bit-identical (mx.twins)."
        ),
        kind="eps",
        bound=1.0,
        scale="(gamma_K(u) + u + gamma_K(2^-53)(1 + u)) |A||B| / eps, u = 2^-24",
        reason=_GEMM_REASON + (
            " Blocks of one magnitude would make the fp6/fp4 products exact in float32 (few "
            "significant bits, one scale): the spread of block scales makes them round."
        ),
    ),
    Claim(
        id="fp8_gemm.mx_torchao",
        extra="torchao",
        statement=(
            "torch_impl.fp8_gemm.mx_matmul gives the bits of torch.mm on two torchao 0.18 "
            "MXTensors (MXTensor.to_mx of a and of b^T, the second transposed; the emulated "
            "kernel preference) for every element format, floor and rceil_log2f (torchao's "
            "RCEIL on CPU) scales."
        ),
        kind="bits",
        bound=0,
        reason=(
            "torchao's emulated mm dequantizes each MXTensor to float32 (to_dtype: the "
            "values of mx.torchao, bit for bit) and calls aten.mm on them, a row-major and "
            "b column-major; torch_impl lays them out the same way and calls torch.mm: the "
            "same BLAS call on the same operands."
        ),
    ),
)

_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_gemm",
    modules=("reference.fp8_gemm", "torch_impl.fp8_gemm"),
    rows=(
        Twin("FP8_FORMATS", reference="reference.fp8_gemm:FP8_FORMATS",
             torch="torch_impl.fp8_gemm:FP8_DTYPES", claims=("fp8_gemm.dequantize",)),
        _same("fp8_gemm", "dequantize", "fp8_gemm.dequantize"),
        _same("fp8_gemm", "matmul_f32", "fp8_gemm.reference"),
        Twin("scaled_mm", reference="reference.fp8_gemm:scaled_mm",
             torch="torch_impl.fp8_gemm:scaled_mm",
             claims=("fp8_gemm.scaled_mm_cpu", "fp8_gemm.reference"),
             why="torch._scaled_mm is the kernel torch_impl's scaled_mm writes out"),
        Twin("cpu_scaled_mm_support", torch="torch_impl.fp8_gemm:cpu_scaled_mm_support",
             claims=("fp8_gemm.scaled_mm_cpu",),
             why="which scales this torch's CPU _scaled_mm takes: the reference's has no "
                 "version"),
        _same("fp8_gemm", "mx_matmul", "fp8_gemm.mx_twins", "fp8_gemm.mx_torchao"),
    ),
    headline="parity/test_fp8_gemm.py::"
             "test_two_e4m3_matrices_multiply_within_the_gemm_bound_of_torch_scaled_mm",
)
