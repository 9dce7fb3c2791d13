"""fp8 and MX GEMMs: torch._scaled_mm on CPU against its emulation in torch ops, bit for bit,
and against scaling the product instead (fp8_gemm.scaled_mm_cpu); the reference's
dequantization against torch's on every code (fp8_gemm.dequantize); the reference's GEMM
within the derived bound of torch's (fp8_gemm.reference) and the two trees' MX GEMMs
(fp8_gemm.mx_twins). torchao's MX mm: parity/test_fp8_gemm_torchao.py. Driver: parity/
drivers/fp8_gemm.py. CPU only: _scaled_mm on CUDA is cuBLASLt, another kernel.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from parity.claims.fp8_gemm_bounds import gemm_scale
from parity.compare import assert_claim, in_eps_units
from parity.drivers import fp8_gemm as drv
from parity.strategies import examples, fp8_gemm_cases
from parity.strategies.fp8_gemm import FORMAT_PAIRS, SCALE_RESULTS, scale_result_edges
from reference import fp8_gemm as rgemm
from reference import fp8_scaling as rfp8
from reference import mx as rmx
from torch_impl import fp8_gemm as tgemm
from torch_impl import fp8_scaling as tfp8
from torch_impl import mx as tmx

TENSORWISE, ROWWISE = tgemm.cpu_scaled_mm_support()
NO_CPU_KERNEL = ("this torch has no CPU torch._scaled_mm (added in torch 2.8, tensorwise; "
                 "rowwise scales from 2.12: torch_impl/fp8_gemm.py)")


def _require(rowwise: bool, device: str) -> None:
    if device != "cpu":
        pytest.skip("the claim is about the CPU kernel (on CUDA _scaled_mm is cuBLASLt)")
    if not (ROWWISE if rowwise else TENSORWISE):
        pytest.skip(NO_CPU_KERNEL + ("; this one lacks rowwise scales" if TENSORWISE else ""))


def _emulated_kernels() -> list[bool]:
    """mkldnn disabled (the emulation on any CPU), and enabled where the CPU has no AMX
    (with AMX, _scaled_mm calls oneDNN instead: no claim)."""
    return [False] if torch.cpu._is_amx_tile_supported() else [False, True]


@contextmanager
def _mkldnn(enabled: bool) -> Iterator[None]:
    """torch.backends.mkldnn.enabled set, then restored (mkldnn.flags() also re-sets the
    oneDNN TF32 flag, which warns on a torch without Intel GPU support)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def _bias(n: int, out_dtype: torch.dtype) -> torch.Tensor:
    b = torch.linspace(-3.0, 5.0, n)
    return b.to(out_dtype) if out_dtype in (torch.bfloat16, torch.float16) else b


def test_two_e4m3_matrices_multiply_within_the_gemm_bound_of_torch_scaled_mm(device: str
                                                                             ) -> None:
    """Two float32 matrices cast to float8_e4m3fn by current tensorwise scaling in each tree:
    the reference's dequantize-then-matmul (float64 sum, one rounding) is within
    fp8_gemm.reference's bound of torch._scaled_mm on torch's own cast of the same values."""
    _require(False, device)
    rng = np.random.default_rng(0)
    x = np.exp2(rng.uniform(-6, 6, (8, 32))).astype(np.float32)  # (M, K), same sign
    w = np.exp2(rng.uniform(-6, 6, (32, 16))).astype(np.float32)  # (K, N)
    ref_a, ref_sa = rfp8.current_scaling(x, "float8_e4m3fn")  # fp8 (M, K), float32 ()
    ref_b, ref_sb = rfp8.current_scaling(w, "float8_e4m3fn")  # fp8 (K, N), float32 ()
    ref_y = rgemm.scaled_mm(ref_a, ref_b, 1 / ref_sa, 1 / ref_sb)  # (M, N) float32
    torch_a, torch_sa = tfp8.current_scaling(torch.from_numpy(x), "float8_e4m3fn")
    torch_b, torch_sb = tfp8.current_scaling(torch.from_numpy(w), "float8_e4m3fn")
    torch_y = torch._scaled_mm(torch_a, torch_b, scale_a=1 / torch_sa, scale_b=1 / torch_sb,
                               out_dtype=torch.float32)  # (M, N)
    assert ref_sa != 1 and ref_sb != 1  # the casts really scaled
    assert np.array_equal(ref_a.view(np.uint8), torch_a.view(torch.uint8).numpy())  # same codes
    s = gemm_scale(rgemm.dequantize(ref_a, 1 / ref_sa), rgemm.dequantize(ref_b, 1 / ref_sb))
    assert_claim("fp8_gemm.reference", actual=torch_y, expected=ref_y, scale=s)


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("fmts", FORMAT_PAIRS, ids=lambda f: f"{f[0][7:]}x{f[1][7:]}")
def test_cpu_scaled_mm_is_dequantize_then_float32_matmul_bitwise(
        fmts: tuple[str, str], rowwise: bool, device: str) -> None:
    """Every out_dtype, with and without bias, with and without scale_result (which only an
    fp8 output uses), use_fast_accum either way; and the product scaled afterwards differs
    in most outputs."""
    _require(rowwise, device)
    case = drv.fp8_case(24, 96, 40, fmts, rowwise, seed=7, same_sign=False)
    a, b, sa, sb = drv.torch_operands(case)
    for mkldnn in _emulated_kernels():
        with _mkldnn(mkldnn):
            for out_dtype, scale_result in itertools.product(
                    drv.OUT_DTYPES, (None, torch.tensor(0.75))):
                for bias in (None, _bias(b.shape[1], out_dtype)):
                    for fast in (False, True):
                        got = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, bias=bias,
                                               out_dtype=out_dtype, scale_result=scale_result,
                                               use_fast_accum=fast)
                        want = tgemm.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype,
                                               scale_result=scale_result)
                        context = (f"mkldnn={mkldnn} {out_dtype} bias={bias is not None} "
                                   f"fast={fast} scale_result={scale_result}")
                        assert_claim("fp8_gemm.scaled_mm_cpu", actual=got, expected=want,
                                     context=context)
            y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
            after = (a.to(torch.float32) @ b.to(torch.float32)) * (sa * sb)  # scale the product
            differ = int(torch.count_nonzero(y != after))
            assert differ > y.numel() // 2, f"guard: scaling the product differs ({differ})"


@pytest.mark.parametrize("out_dtype", tgemm.FP8_DTYPES, ids=lambda d: str(d)[13:])
def test_fp8_output_is_the_product_times_the_float32_reciprocal_of_scale_result(
        out_dtype: torch.dtype, device: str) -> None:
    """On the products where f32(y / s) and f32(y * f32(1 / s)) cast to different fp8
    codes (scale_result_edges, both signs): torch_impl gives the second, the cast of
    y * f32(1 / s) by ml_dtypes, and so does torch._scaled_mm where the CPU kernel exists."""
    fmt = str(out_dtype)[6:]
    a = torch.ones(1, 1).to(torch.float8_e4m3fn)  # y = f32(1 * sa) * f32(1 * 1) = sa
    kernel = device == "cpu" and TENSORWISE
    reached = 0
    for s in SCALE_RESULTS:
        s32, edges = np.float32(s), scale_result_edges(fmt, s)
        reached += len(edges)
        scale_result, one = torch.tensor(float(s32)), torch.tensor(1.0)
        want = (edges * (np.float32(1) / s32)).astype(getattr(ml_dtypes, fmt))  # the truth
        quotient = torch.from_numpy(edges / s32).to(out_dtype)
        for y, w, q in zip(edges, want.view(np.uint8), quotient.view(torch.uint8),
                              strict=True):
            sa = torch.tensor(float(y))
            assert int(q) != int(w), f"guard: {y!r} / {s} is not an edge under torch's cast"
            tor = tgemm.scaled_mm(a, a, sa, one, out_dtype=out_dtype, scale_result=scale_result)
            assert int(tor.view(torch.uint8)) == int(w), (
                f"y={y!r} scale_result={s}: code {int(tor.view(torch.uint8))}, the "
                f"reciprocal's is {int(w)}, the quotient's {int(q)}")
            if kernel:
                for mkldnn in _emulated_kernels():
                    with _mkldnn(mkldnn):
                        got = torch._scaled_mm(a, a, scale_a=sa, scale_b=one,
                                               out_dtype=out_dtype, scale_result=scale_result)
                    assert_claim("fp8_gemm.scaled_mm_cpu", actual=got, expected=tor,
                                 context=f"mkldnn={mkldnn} y={y!r} scale_result={s}")
    assert reached >= 50, f"guard: only {reached} scale_result edges for {fmt}"


def test_reference_dequantize_gives_torchs_bits_on_every_code() -> None:
    """All 256 codes of each fp8 format times tensorwise and rowwise scales: normal ones,
    one that makes subnormal float32 products, powers of two, one that overflows."""
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    scales = np.array([0.37, 1.9, 2.0**-130 * 3, 2.0**-9, 2.0**120 * 1.7, 1.0 / 448],
                      dtype=np.float32)
    rowwise = np.exp2(np.arange(-8, 8, dtype=np.float32)).reshape(16, 1) * np.float32(1.3)
    for fmt, dtype in rgemm.FP8_FORMATS.items():
        x = codes.view(dtype)
        xt = drv.to_torch_fp8(x)
        for s in [*scales, rowwise, rowwise.T.copy()]:
            with np.errstate(over="ignore", invalid="ignore"):
                ref = rgemm.dequantize(x, s)
            tor = tgemm.dequantize(xt, torch.from_numpy(np.asarray(s, np.float32).copy()))
            assert_claim("fp8_gemm.dequantize", actual=tor, expected=ref,
                         context=f"{fmt} scale {np.shape(s)}")
        assert np.isnan(ref).any(), "guard: the NaN codes were compared"
    with np.errstate(over="ignore"):
        big = rgemm.dequantize(codes.view(ml_dtypes.float8_e5m2), np.float32(2.0**120))
    assert np.isinf(big).any(), "guard: a product beyond float32's max"


def test_reference_scaled_mm_is_within_the_derived_bound_of_torch(device: str) -> None:
    """Tensorwise and rowwise, every format pair, K = 32, 64, 256, same and mixed signs:
    against torch_impl's emulation and, where the CPU kernel exists, torch._scaled_mm;
    the worst case is above 1/100 of the bound (it sees what it bounds)."""
    worst = 0.0
    for k in drv.GEMM_K:
        for fmts in FORMAT_PAIRS:
            for rowwise in (False, True):
                for same_sign in (True, False):
                    case = drv.fp8_case(16, k, 24, fmts, rowwise, seed=k, same_sign=same_sign)
                    ref, tor, s = drv.both_scaled_mm(case)
                    context = f"K={k} {fmts} rowwise={rowwise} same_sign={same_sign}"
                    assert_claim("fp8_gemm.reference", actual=tor, expected=ref, context=context,
                                 scale=s)
                    worst = max(worst, float(in_eps_units(tor, ref, s).max()))
                    if device == "cpu" and (ROWWISE if rowwise else TENSORWISE):
                        a, b, sa, sb = drv.torch_operands(case)
                        got = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                               out_dtype=torch.float32)
                        assert_claim("fp8_gemm.reference", actual=got, expected=ref,
                                     context=context, scale=s)
    assert worst > 0.01, f"guard: the bound is blind (worst {worst:.3g} of it)"


@given(drawn=fp8_gemm_cases())
@settings(examples(25))
def test_scaled_mm_of_any_shape_is_torchs_bits_and_within_the_bound_of_the_reference(
        drawn: tuple[dict, list[str]], device: str) -> None:
    """Any shape (K = 1 and odd K included), format pair, scale kind and sign pattern:
    torch._scaled_mm is its emulation's bits, the reference within the derived bound."""
    kwargs, edges = drawn
    for edge in edges:
        event(edge)
    case = drv.fp8_case(**kwargs)
    ref, tor, s = drv.both_scaled_mm(case)
    assert_claim("fp8_gemm.reference", actual=tor, expected=ref, context=str(kwargs), scale=s)
    if device == "cpu" and (ROWWISE if kwargs["rowwise"] else TENSORWISE):
        a, b, sa, sb = drv.torch_operands(case)
        for mkldnn in _emulated_kernels():  # with AMX and mkldnn on, oneDNN: no claim
            with _mkldnn(mkldnn):
                got = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
            assert_claim("fp8_gemm.scaled_mm_cpu", actual=got, expected=tor,
                         context=f"mkldnn={mkldnn} {kwargs}")


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_mx_matmuls_of_both_trees_are_within_the_derived_bound(fmt: str) -> None:
    """floor and rceil_log2f scales, K = 64 and 256, block magnitudes 2^-12 .. 2^12; the
    dequantized operands are the same bits (mx.twins) and the bound is exercised."""
    worst = 0.0
    for mode in ("floor", "rceil_log2f"):
        for k in (64, 256):
            a, b = drv.mx_operands(16, k, 24, seed=k)
            ref, tor, s = drv.both_mx_matmul(a, b, fmt, mode)
            assert_claim("fp8_gemm.mx_twins", actual=tor, expected=ref,
                         context=f"{fmt} {mode} K={k}", scale=s)
            worst = max(worst, float(in_eps_units(tor, ref, s).max()))
            assert_claim("mx.twins", actual=tmx.from_mx(tmx.to_mx(torch.from_numpy(a), fmt, mode)),
                         expected=rmx.from_mx(rmx.to_mx(a, fmt, mode)),
                         context=f"{fmt} {mode} operand a")
    assert worst > 0.01, f"guard: the bound is blind (worst {worst:.3g} of it)"
