"""torch_impl.formats against documented PyTorch behaviour and exact arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torch_impl.formats as tim

NAMED = tuple(tim.FORMATS)


def _t(values: list[float], device: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


# The small formats' ranges come from their bits, where torch.finfo is wrong or missing
# (parity/claims/formats_small.py): float8_e5m2fnuz's finfo eps is 2^-3 for a format whose
# spacing at 1 is 2^-2 (formats.torch_finfo_e5m2fnuz), and E8M0 has no sign bit, no zero and
# no subnormal (torch casts 0 to 2^-127: formats.e8m0_torch).
FINFO_EPS_WRONG = {"float8_e5m2fnuz": 2.0**-3}
UNSIGNED = {"float8_e8m0fnu"}


@pytest.mark.parametrize("name", NAMED)
def test_ranges_follow_torch_finfo_and_add_smallest_subnormal(name: str) -> None:
    """max/tiny/eps are torch.finfo's (but the one eps torch gets wrong); smallest_subnormal
    = tiny * eps is a member > 0 whose half rounds to 0 (E8M0: no subnormal, no zero)."""
    fmt = tim.FORMATS[name]
    if fmt.dtype is not None:
        fi = torch.finfo(fmt.dtype)
        assert (fmt.max, fmt.tiny, fmt.bits) == (fi.max, fi.tiny, fi.bits)
        assert fi.eps == FINFO_EPS_WRONG.get(name, fmt.eps)
        sub = torch.tensor(fmt.smallest_subnormal).to(fmt.dtype).float().item()
        assert sub == fmt.smallest_subnormal
        half = torch.tensor(sub / 2).to(fmt.dtype).item()
        assert half == (fmt.tiny if name in UNSIGNED else 0)
    assert fmt.exponent_bits + fmt.mantissa_bits + (name not in UNSIGNED) == fmt.bits


def test_float16_facts_every_course_teaches(device: str) -> None:
    """1e-8 -> 0, 70000 -> inf, 65504 survives, in torch's own cast."""
    q = tim.quantize(_t([1e-8, 70000.0, 65504.0], device), "float16")
    assert q.tolist() == [0.0, math.inf, 65504.0]


def test_float8_e4m3fn_overflow_follows_the_installed_torch_version(device: str) -> None:
    """torch >= 2.13 saturates e4m3fn (+-inf included); older torch gives NaN (2.12.1 does)."""
    x = _t([500.0, math.inf, -1e9, 464.0], device)
    native = x.to(torch.float8_e4m3fn).float().cpu()
    if tim.E4M3FN_SATURATES:
        assert native.tolist() == [448.0, 448.0, -448.0, 448.0]
    else:
        assert torch.isnan(native[:3]).all() and native[3].item() == 448.0
    assert tim.quantize(x, "float8_e4m3fn", overflow="nan").isnan().tolist() == \
        [True, True, True, False]
    assert tim.quantize(x, "float8_e4m3fn", overflow="saturate").tolist() == \
        [448.0, 448.0, -448.0, 448.0]


def test_bfloat16_nan_bits_depend_on_the_code_path() -> None:
    """Why NaNs compare as a class: the same cast gives 0xFFFF on a 1-d CPU tensor and
    0x7FC0 on a 0-d one (torch 2.13, CPU)."""
    one_d = torch.tensor([math.nan]).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
    zero_d = torch.tensor(math.nan).to(torch.bfloat16).view(torch.int16).item() & 0xFFFF
    assert {one_d, zero_d} <= {0xFFFF, 0x7FC0}
    assert math.isnan(torch.tensor([one_d, zero_d], dtype=torch.int32).to(torch.int16)
                      .view(torch.bfloat16).float()[0].item())


def test_float64_input_is_double_rounded_by_torch_and_correctly_rounded_here(
    device: str
) -> None:
    """1 + 2^-8 + 2^-40: torch's cast gives bf16 1.0, round-to-odd gives 1.0078125."""
    x = _t([1 + 2.0**-8 + 2.0**-40], device, torch.float64)
    assert x.to(torch.bfloat16).item() == 1.0
    assert tim.quantize(x, "bfloat16", via="float32").item() == 1.0
    assert tim.quantize(x, "bfloat16").item() == 1.0078125


def test_tf32_rounds_to_ten_mantissa_bits_with_ties_to_even(device: str) -> None:
    """tf32 has no dtype: 1 + 2^-11 ties to 1, 1 + 3 * 2^-11 ties up to 1 + 2^-9, float32
    max (above tf32 max + half an ulp) overflows."""
    x = _t([1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-10), torch.finfo().max], device)
    assert tim.quantize(x, "tf32").tolist() == [1.0, 1 + 2.0**-9, -(1 + 2.0**-10), math.inf]


def test_toward_zero_never_increases_magnitude(device: str) -> None:
    """|q(x)| <= |x| for finite x, and q is a member (the native cast leaves it unchanged)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g).mul(2.0 ** torch.randint(-30, 30, (4096,), generator=g))
    x = x.to(device)
    for name in ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn"):
        q = tim.quantize(x, name, rounding="toward_zero")
        assert (q.abs() <= x.abs()).all()
        assert torch.equal(q.to(tim.FORMATS[name].dtype).float(), q)


def test_stochastic_rounding_is_reproducible_from_the_generator(device: str) -> None:
    """The same seed gives the same result; a different seed a different one."""
    x = torch.full((1000,), 1 + 2.0**-9, device=device)

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator(device=device).manual_seed(seed)
        return tim.quantize(x, "bfloat16", rounding="stochastic", rng=g)

    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_encode_decode_roundtrip_over_every_16_bit_code(device: str) -> None:
    """decode then encode returns every non-NaN code (CPU or CUDA)."""
    for name in ("float16", "bfloat16"):
        fmt = tim.FORMATS[name]
        codes = torch.arange(2**16, dtype=torch.int32).to(torch.uint16).to(device)
        values = tim.decode(codes, name)
        back = tim.encode(values.to(torch.float32), name)
        assert back.dtype == fmt.code_dtype == torch.uint16
        keep = ~values.isnan()
        # (torch 2.6 cannot index uint16 tensors: compare as int32)
        assert torch.equal(back.to(torch.int32)[keep].cpu(), codes.to(torch.int32)[keep].cpu())


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: tim.get_format("float12"), ValueError, "unknown format"),
        (lambda: tim.quantize(np.array([1.0]), "float16"), TypeError, "torch.Tensor"),
        (lambda: tim.quantize(torch.tensor([1, 2]), "float16"), TypeError, "float32 or float64"),
        (lambda: tim.quantize(torch.tensor([1.0]), "float16", rounding="up"), ValueError,
         "nearest_even, toward_zero, stochastic"),
        (lambda: tim.quantize(torch.tensor([1.0]), "float16", rounding="stochastic"), ValueError,
         "exactly one of rng="),
        (lambda: tim.quantize(torch.tensor([1.0]), "float8_e4m3fn", overflow="inf"), ValueError,
         "has no infinity"),
        (lambda: tim.quantize(torch.tensor([1.0]), "float16", via="float32"), ValueError,
         "float64 input only"),
        (lambda: tim.decode(torch.tensor([1.0]), "float16"), TypeError, "integer tensor"),
    ],
)
def test_bad_input_gets_a_clear_error(call: object, error: type, words: str) -> None:
    """Unknown formats, non-tensors, unknown modes and missing generators are named."""
    with pytest.raises(error, match=words):
        call()  # type: ignore[operator]
