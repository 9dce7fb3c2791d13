"""The small formats' torch twin (torch_impl.formats, torch_impl/small_formats.py) against the
reference, code for code.

Every assertion names claim formats.small_torch_twin (parity/claims/formats_small.py). The
exhaustive form, all 2^32 float32 inputs three-way, is parity/test_formats_small.py's slow
sweep: its torch column is this twin.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.formats as ref
import torch_impl.formats as tim
from parity import oracles
from parity.compare import assert_claim
from parity.drivers import formats_small as drive
from parity.strategies import examples
from parity.sweep_small import small_classes, torch_e8m0_codes
from torch_impl.small_formats import NATIVE

small = pytest.mark.parametrize("name", oracles.SMALL_FORMATS)
CLAIM = "formats.small_torch_twin"


def policies(name: str) -> tuple[str | None, ...]:
    """The default (None) and every overflow policy the format allows."""
    fmt = ref.FORMATS[name]
    if fmt.convention == "finite":
        return (None, "saturate")
    if fmt.convention == "ieee":
        return (None, "inf", "saturate", "nan", "saturate_finite")
    return (None, "saturate", "nan")


def edge_cases(name: str, seed: int, dtype: type) -> np.ndarray:
    """drive.edge_inputs (members, ties and 1-2 float32 ulps either side, the overflow
    boundary, specials, random patterns, both signs); float64 ones also moved off the
    float32 grid by a few float64 ulps."""
    rng = np.random.default_rng(seed)
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        x = drive.edge_inputs(name, seed, n_random=512).astype(dtype)
    if dtype == np.float64:
        with np.errstate(invalid="ignore", over="ignore"):
            moved = x + np.where(np.isfinite(x), np.spacing(x) * rng.integers(-9, 10, x.size), 0)
        x = np.concatenate([x, moved])
    return x


def reference_codes(x: np.ndarray, name: str, rounding: str, overflow: str | None,
                    subnormals: bool, words: np.ndarray | None) -> np.ndarray:
    """What the twin must give: the reference's codes, or for E8M0 to nearest, where the twin
    is torch's cast (torch >= 2.7), the reference's statement of that cast (claim
    formats.e8m0_torch)."""
    fmt = ref.FORMATS[name]
    if name == "float8_e8m0fnu" and name in NATIVE and rounding == "nearest_even":
        return torch_e8m0_codes(x, fmt, overflow)
    kw = {"random_bits": words} if rounding == "stochastic" else {}
    return ref.encode(x, name, rounding=rounding, overflow=overflow, subnormals=subnormals, **kw)


@small
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(examples(1))  # x ~2,600-5,200 inputs, every edge class; the fuzz profile: more
@given(seed=st.integers(0, 2**32 - 1), subnormals=st.booleans())
def test_torch_twin_encodes_every_edge_class_like_the_reference(name: str, dtype: type,
                                                                seed: int,
                                                                subnormals: bool) -> None:
    """Every rounding mode and overflow policy, code for code."""
    x = edge_cases(name, seed, dtype)
    classes = small_classes(x, np.isnan(x), ref.FORMATS[name])
    assert min(classes.values()) > 0, classes  # the guard: every input class is reached
    rng = np.random.default_rng(seed)
    # the words either side of each threshold (where < and <= differ), on a sample of the
    # inputs within the format's range
    with np.errstate(invalid="ignore"):
        sample = rng.choice(x[np.abs(x) <= ref.FORMATS[name].max], 300)
    at = np.array([drive.oracle_threshold(v, name) for v in sample.tolist()], dtype=np.int64)
    assert (at > 0).sum() > 50  # the guard: many sampled inputs lie between two members
    stochastic = [(x, ref.draw_random_words(x.shape, rng)),
                  (sample, np.minimum(at, 2**32 - 1).astype(np.uint32)),
                  (sample, np.maximum(at - 1, 0).astype(np.uint32))]
    for rounding in tim.ROUNDING_MODES:
        cases = stochastic if rounding == "stochastic" else [(x, None)]
        for overflow in policies(name):
            for inputs, words in cases:
                want = reference_codes(inputs, name, rounding, overflow, subnormals, words)
                kw = {"random_bits": torch.from_numpy(words.astype(np.int64))} \
                    if words is not None else {}
                got = tim.encode(torch.from_numpy(inputs), name, rounding=rounding,
                                 overflow=overflow, subnormals=subnormals, **kw)
                assert got.dtype == torch.uint8
                assert_claim(CLAIM, actual=got.numpy(), expected=want,
                             context=f"({name}, {dtype.__name__}, {rounding}, overflow={overflow}, "
                                     f"subnormals={subnormals})")


@small
@pytest.mark.parametrize("subnormals", [True, False], ids=["subnormals", "flushed"])
def test_torch_twin_encodes_a_chunk_without_nan_like_the_reference(name: str,
                                                                   subnormals: bool) -> None:
    """Round to nearest of float32 input with no NaN in the tensor, the one case where the
    twin builds no NaN mask (NOTE [ A sweep's chunk in place ]), and with only the NaNs
    nearest +-inf (payload 1, the first a sweep's chunk meets), every overflow policy: code
    for code. (Every other test's inputs hold quiet NaNs, far above +inf's bits.)"""
    x = edge_cases(name, 5, np.float32)
    x = x[~np.isnan(x)]
    assert np.isinf(x).any() and (np.abs(x) > ref.FORMATS[name].max).any()  # beyond max
    lowest_nans = np.array([0x7F800001, 0xFF800001, 0x7F800000, 0x3F800000],
                           np.uint32).view(np.float32)
    for inputs in (x, lowest_nans):
        for overflow in policies(name):
            want = reference_codes(inputs, name, "nearest_even", overflow, subnormals, None)
            got = tim.encode(torch.from_numpy(inputs), name, overflow=overflow,
                             subnormals=subnormals)
            assert_claim(CLAIM, actual=got.numpy(), expected=want,
                         context=f"({name}, {inputs!r}, overflow={overflow}, "
                                 f"subnormals={subnormals})")


@small
def test_torch_twin_decodes_every_code_like_the_reference(name: str) -> None:
    codes = np.arange(2 ** ref.FORMATS[name].bits, dtype=np.uint8)
    for dtype, np_dtype in ((torch.float64, np.float64), (torch.float32, np.float32)):
        got = tim.decode(torch.from_numpy(codes), name, dtype=dtype).numpy()
        assert_claim(CLAIM, actual=got, expected=ref.decode(codes, name, dtype=np_dtype),
                     context=f"({name}, {dtype})")


@small
def test_torch_twin_quantize_is_encode_then_decode_like_the_reference(name: str) -> None:
    x = edge_cases(name, 0, np.float32)
    want = ref.quantize(x, name) if name != "float8_e8m0fnu" or name not in NATIVE else \
        ref.decode(torch_e8m0_codes(x, ref.FORMATS[name]), name).astype(np.float32)
    got = tim.quantize(torch.from_numpy(x), name)
    assert got.dtype == torch.float32
    assert_claim(CLAIM, actual=got.numpy(), expected=want, context=f"({name})")


def test_unknown_formats_and_policies_are_refused_naming_the_known_ones() -> None:
    x = torch.tensor([1.0])
    with pytest.raises(ValueError, match=r"unknown format 'float4_e2m1'.*float4_e2m1fn"):
        tim.encode(x, "float4_e2m1")
    with pytest.raises(ValueError, match="no NaN and no infinity"):
        tim.encode(x, "float6_e3m2fn", overflow="nan")
    with pytest.raises(ValueError, match="no infinity"):
        tim.encode(x, "float8_e4m3b11fnuz", overflow="inf")
    with pytest.raises(ValueError, match="codes out of range for the 4-bit format"):
        tim.decode(torch.tensor([16]), "float4_e2m1fn")
    with pytest.raises(TypeError, match="float32 or float64"):
        tim.quantize(torch.tensor([1.0], dtype=torch.float16), "float8_e3m4")
