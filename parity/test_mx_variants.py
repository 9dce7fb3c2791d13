"""The libraries' MX variants, each held to its library's rule computed apart (NOTE [ Variants
written apart ] in reference/mx_variants.py): microxcaling's Python path transcribed in torch
ops (mx.microxcaling), its C++ path's mantissa shifts on the float32 bits (mx.microxcaling_cpp),
Transformer Engine's MXFP8 kernel in Python scalars (mx.transformer_engine), on edge blocks,
under hypothesis and on the rows of docs/sources/block_scaling.md; and the docs table of
where the variants part (mx.variants_table).
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from hypothesis import event, given, settings

from parity.compare import assert_claim
from parity.drivers import mx as drv
from parity.strategies import edge_array, examples, mx_blocks
from reference import mx as rmx

MX_PAGE = Path(__file__).resolve().parents[1] / "docs" / "mx.md"
# microxcaling's _get_format_params (mx/formats.py): ebits, mbits (sign and implicit bit
# included), emax, max_norm
MX_PARAMS = {"float8_e4m3fn": (4, 5, 8, 448.0), "float8_e5m2": (5, 4, 15, 57344.0),
             "float6_e3m2fn": (3, 4, 4, 28.0), "float6_e2m3fn": (2, 5, 2, 7.5),
             "float4_e2m1fn": (2, 3, 2, 6.0)}
ML = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}


def microxcaling_python(x: np.ndarray, fmt: str) -> np.ndarray:
    """microxcaling v1.1.0's _quantize_mx (custom_cuda=False, round='nearest', blocks of 32
    on the last axis), its torch ops in its order: float32 values shaped as x."""
    ebits, mbits, emax, max_norm = MX_PARAMS[fmt]
    a = torch.from_numpy(x.reshape(-1, 32).copy())
    shared = torch.max(torch.abs(a), dim=-1, keepdim=True).values  # _shared_exponents
    shared = torch.floor(torch.log2(shared + 2.0**-126 * (shared == 0).type(shared.dtype)))
    shared = shared - emax
    shared[shared > 127] = float("NaN")
    shared[shared < -127] = -127
    a = a / (2**shared)
    private = torch.floor(torch.log2(torch.abs(a) + (a == 0).type(a.dtype)))  # _elemwise_core
    private = private.clip(min=-(2 ** (ebits - 1)) + 2)
    out = a / (2**private) * (2 ** (mbits - 2))
    out = torch.sign(out) * torch.floor(torch.abs(out) + 0.5)  # _round_mantissa "nearest"
    out = out / (2 ** (mbits - 2)) * (2**private)
    out = torch.clamp(out, min=-max_norm, max=max_norm)
    out[a == float("Inf")] = float("Inf")
    out[a == -float("Inf")] = -float("Inf")
    return (out * (2**shared)).reshape(x.shape).numpy()


def _word(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _float(w: int) -> float:
    return struct.unpack("<f", struct.pack("<I", w & 0xFFFFFFFF))[0]


def _quantize_elemwise(v: float, bits: int, exp_bits: int, max_norm: float) -> float:
    """mx/cpp/quantize.cuh quantize_elemwise(rd_away, saturate_normals, allow_denorm)."""
    if v == 0.0:
        return 0.0
    w = _word(v)
    biased_exp, sign, tmant = (w >> 23) & 0xFF, w >> 31, w & 0x7FFFFF
    mbits = bits - 1
    new_biased_exp = biased_exp - 127 + (1 << (exp_bits - 1)) - 1
    exp_diff = min(1 - new_biased_exp if new_biased_exp <= 0 else 0, 24)
    subnormal = biased_exp == 0
    sig_bits = 23 if subnormal else 24
    m = tmant if subnormal else tmant + (1 << 23)  # shift_right_round_mantissa
    m = (m >> exp_diff) >> (sig_bits - mbits - 1)
    m = (m + 1) >> 1  # rd_away: the guard bit added, then dropped
    if m == 0:
        return 0.0
    m = m << (sig_bits - mbits + exp_diff)  # shift_left_mantissa
    overflow = m >= (1 << sig_bits)
    m = (m >> 1 if overflow and not subnormal else m) & 0x7FFFFF
    out = _float((sign << 31) | ((biased_exp + overflow) << 23) | m)
    return math.copysign(max_norm, out) if abs(out) > max_norm else out


def microxcaling_cpp(x: np.ndarray, fmt: str) -> np.ndarray:
    """microxcaling's C++ path (mx.cuh, shared_exp.cuh mx_get_shared_scale, quantize_mx_elem)
    in Python scalars: float32 values shaped as x."""
    ebits, mbits, _, max_norm = MX_PARAMS[fmt]
    elem_emax = (_word(max_norm) >> 23) - 127
    f32 = np.float32
    values = []
    for block in x.reshape(-1, 32).astype(np.float64):
        shared = (_word(float(np.max(np.abs(block)))) >> 23) & 0xFF  # NaN, inf: 255
        shared = shared - elem_emax if shared != 255 else shared
        shared = 255 if shared - 127 > 127 else (0 if shared - 127 < -127 else shared)
        scale = _float((shared << 23) | (0x400000 if shared in (0, 255) else 0))
        with np.errstate(invalid="ignore"):
            values.append([float(f32(_quantize_elemwise(float(f32(v / scale)), mbits, ebits,
                                                        max_norm) * scale)) for v in block])
    return np.array(values, np.float32).reshape(x.shape)


def _float_to_e8m0(d: float) -> int:
    """ptx_arch_spec.cuh float_to_e8m0, its software path (cvt.rp.satfinite's twin)."""
    if d != d:
        return 0xFF
    if d == math.inf:
        return 0xFE
    if d == 0:
        return 0
    w = _word(d)
    exponent, mantissa = w >> 23, w & 0x7FFFFF
    if mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


def _exp2f_rcp(code: int) -> float:
    """ptx.cuh exp2f_rcp<float>: NaN at 255, 2^-127 at 254, else (254 - code) << 23."""
    return math.nan if code == 255 else _float(0x400000 if code == 254 else (254 - code) << 23)


def te_mxfp8(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Transformer Engine's MXFP8 quantize (quantize_mxfp8.cuh) and dequantize
    (dequantize_mxfp8.cuh) in Python scalars: (E8M0 codes (..., n), float32 values)."""
    f32 = np.float32
    max_norm = float(rmx.FORMATS[fmt].max)
    rcp = float(f32(1.0 / max_norm))  # constexpr float max_norm_rcp = 1.0 / max_norm
    codes, values = [], []
    for block in x.reshape(-1, 32).astype(np.float64):
        amax = 0.0
        for v in block:  # fmaxf: a NaN operand gives the other
            amax = amax if v != v else max(amax, abs(v))
        code = _float_to_e8m0(float(f32(amax * rcp)))
        r = _exp2f_rcp(code)
        with np.errstate(invalid="ignore", over="ignore"):
            q = np.array([f32(v * r) for v in block], np.float64)
            p = np.clip(q, -max_norm, max_norm).astype(ML[fmt]).astype(np.float64)  # satfinite
            scale = math.nan if code == 255 else _float(0x400000 if code == 0 else code << 23)
            values.append([f32(scale * e) for e in p])
        codes.append(code)
    return (np.array(codes, np.uint8).reshape(*x.shape[:-1], -1),
            np.array(values, np.float32).reshape(x.shape))


def _values(x: np.ndarray, fmt: str, variant: str) -> np.ndarray:
    return rmx.from_mx(rmx.to_mx(x, fmt, variant=variant))


def _check(x: np.ndarray, fmt: str, context: str) -> None:
    assert_claim("mx.microxcaling", actual=_values(x, fmt, "microxcaling"),
                 expected=microxcaling_python(x, fmt), context=f"{context} python")
    assert_claim("mx.microxcaling_cpp", actual=_values(x, fmt, "microxcaling_cpp"),
                 expected=microxcaling_cpp(x, fmt), context=f"{context} c++")
    if fmt in ML:
        codes, values = te_mxfp8(x, fmt)
        ref = rmx.to_mx(x, fmt, variant="transformer_engine")
        assert_claim("mx.transformer_engine", actual=ref.scales, expected=codes,
                     context=f"{context} te scales")
        assert_claim("mx.transformer_engine", actual=rmx.from_mx(ref), expected=values,
                     context=f"{context} te values")


def test_each_librarys_variant_is_its_rule_on_edge_blocks() -> None:
    """Every element format, every edge kind: the three variants to their libraries."""
    for fmt in rmx.ELEMENT_FORMATS:
        _check(edge_array(fmt, seed=8), fmt, fmt)


@given(case=mx_blocks())
@settings(examples(20))
def test_each_librarys_variant_is_its_rule_for_any_blocks(
        case: tuple[str, str, list[str], np.ndarray]) -> None:
    """Any mix of edge blocks (the variant sets its own mode)."""
    fmt, _, kinds, x = case
    for kind in set(kinds):
        event(kind)
    _check(x, fmt, f"{fmt} {kinds}")


def _block(*values: float) -> np.ndarray:
    x = np.zeros((1, 32), np.float32)
    x[0, :len(values)] = values
    return x


def test_microxcaling_python_path_on_the_notes_rows() -> None:
    """docs/sources/block_scaling.md 2.2-2.3: ties away in fp4 (amax 4: the scale 1), an
    inf and a NaN block NaN, a zero block zeros, -0 -> +0, FLT_MAX -> inf, 2^20 (1 - 2^-24)
    -> 2^20 under fp4 (the specification: 6 2^17), each also against the transcription."""
    fp4 = "float4_e2m1fn"
    ties = _values(_block(4.0, 0.25, 2.5, 5.0, -2.5), fp4, "microxcaling")[0, :5]
    assert ties.tolist() == [4.0, 0.5, 3.0, 6.0, -3.0]
    for x in (_block(1.0, np.inf), _block(1.0, np.nan)):
        assert np.isnan(_values(x, fp4, "microxcaling")).all()
    zeros = _values(_block(-0.0, 0.0), fp4, "microxcaling")
    assert not zeros.any() and not np.signbit(zeros).any(), "zeros, -0 -> +0"
    top = np.finfo(np.float32).max
    assert _values(_block(top), "float8_e4m3fn", "microxcaling")[0, 0] == np.inf
    assert _values(_block(top), "float8_e4m3fn", "ocp")[0, 0] == np.float32(448 * 2.0**119)
    below = np.float32(2.0**20 * (1 - 2.0**-24))
    assert _values(_block(below), fp4, "microxcaling")[0, 0] == 2.0**20
    assert _values(_block(below), fp4, "ocp")[0, 0] == 6 * 2.0**17
    for x, fmt in ((_block(4.0, 0.25, 2.5, 5.0, -2.5, -0.0), fp4), (_block(top), fp4),
                   (_block(below), fp4), (_block(top), "float8_e4m3fn")):
        _check(x, fmt, "row")


def test_microxcaling_cpp_path_keeps_the_specification_but_for_the_sign_of_zero() -> None:
    """The C++ path: ties away, every zero +0 (the specification keeps -0), FLT_MAX finite."""
    fp4 = "float4_e2m1fn"
    x = _block(4.0, 0.25, 2.5, 5.0, -0.0, -0.1)
    got = _values(x, fp4, "microxcaling_cpp")[0, :6]
    assert got.tolist() == [4.0, 0.5, 3.0, 6.0, 0.0, 0.0] and not np.signbit(got).any()
    spec = rmx.from_mx(rmx.to_mx(x, fp4, rounding="nearest_away"))[0, :6]
    assert np.signbit(spec[4]) and np.signbit(spec[5]), "the specification keeps -0"
    _check(x, fp4, "c++ row")


def test_transformer_engine_on_its_rows() -> None:
    """A NaN element leaves the rest (scale from the others), an inf one gives 254 and
    +-448 (448 2^127 decodes to inf), a zero block zeros, a code-0 block is multiplied by
    2^127 (its value kept)."""
    e4m3 = "float8_e4m3fn"
    nan = rmx.to_mx(_block(np.nan, 448.0, 1.0), e4m3, variant="transformer_engine")
    values = rmx.from_mx(nan)[0]
    assert np.isnan(values[0]) and values[1] == 448.0 and values[2] == 1.0
    assert np.isnan(rmx.from_mx(rmx.to_mx(_block(np.nan, 448.0), e4m3, "rceil"))).all()
    inf = rmx.to_mx(_block(np.inf, -1.0), e4m3, variant="transformer_engine")
    assert inf.scales[0, 0] == 254 and rmx.from_mx(inf)[0, 0] == np.inf  # 448 2^127
    tiny = _block(np.float32(2.0**-130), np.float32(-(2.0**-127)))
    kept = rmx.to_mx(tiny, e4m3, variant="transformer_engine")
    assert kept.scales[0, 0] == 0 and np.array_equal(rmx.from_mx(kept), tiny)
    assert not rmx.from_mx(rmx.to_mx(np.zeros((1, 32), np.float32), e4m3,
                                     variant="transformer_engine")).any()
    for x in (_block(np.nan, 448.0, 1.0), _block(np.inf, -1.0), tiny):
        _check(x, e4m3, "te row")


def test_the_docs_table_of_variant_disagreements_is_the_computed_one() -> None:
    """docs/mx.md's table (generated: variants) is the reference's counts now."""
    counts = drv.variant_disagreements()
    page = MX_PAGE.read_text(encoding="utf-8")
    computed, committed = [], []
    for (pair, mode), row in counts.items():
        label = f"{pair} ({mode})"
        found = re.search(rf"^\| {re.escape(label)} \|(.+)\|$", page, flags=re.M)
        assert found, f"docs/mx.md lacks the row {label!r}: python -m parity docs"
        committed.append([int(c.split(" of ")[0]) for c in found.group(1).split("|")])
        computed.append([n for n, _ in row.values()])
    assert_claim("mx.variants_table", actual=np.array(computed), expected=np.array(committed),
                 context="python -m parity docs regenerates the table")
