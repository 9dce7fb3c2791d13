"""Bad input to the NVFP4 twins (reference/nvfp4.py, torch_impl/nvfp4.py): each gets the same
one-line error in both trees (claim nvfp4.twins; an error line counts one value) naming what
was expected and what came, or, for a shape the 16-wide block does not divide, the stated
padding rule (zeros to whole tiles, as TE's reference pads), checked against the matrix
padded by hand. The other recipes' bad input: test_mx_bad_input.py,
test_fp8_blockwise_bad_input.py, test_optim_sr_bad_input.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from parity.compare import assert_claim
from parity.drivers.edges import judge, outcome, to_torch
from reference import nvfp4 as rnv
from torch_impl import nvfp4 as tnv

_RNG = np.random.default_rng(11)
X = _RNG.standard_normal((5, 20)).astype(np.float32)  # 20: not a multiple of 16
X[:, 16:] *= np.float32(2**-10)  # the partial block: padding other than zeros would show
X16 = X[:, :16].copy()


def _same_error(ref_call: Callable[[], Any], torch_call: Callable[[], Any], context: str) -> str:
    """Both trees raise, the same one line (recorded under nvfp4.twins); that line."""
    ref, tor = outcome(ref_call), outcome(torch_call)
    assert ref.error is not None, f"{context}: the reference accepted it"
    judge("nvfp4.twins", ref, tor, context)
    return ref.error


@pytest.mark.parametrize("tile", rnv.TILES)
def test_quantize_pads_a_shape_the_tile_does_not_divide_with_zeros(device: str,
                                                                   tile: tuple[int, int]) -> None:
    """A (5, 20) matrix quantizes as its zero-padded (16, 32) copy cut back to (5, 20) codes
    and (5, 2) scales, in both trees: the padding changes no amax."""
    padded = np.zeros((16, 32), np.float32)
    padded[:5, :20] = X
    want_codes, want_scales, want_amax = rnv.quantize(padded, tile)
    codes, scales, amax = rnv.quantize(X, tile)
    assert codes.shape == (5, 20) and scales.shape == (5, 2)
    assert np.array_equal(codes, want_codes[:5, :20])
    assert np.array_equal(scales, want_scales[:5, :2]) and amax == want_amax
    t_codes, t_scales, _ = tnv.quantize(to_torch(X, device), tile)
    for got, want, what in ((t_codes, codes, "codes"), (t_scales, scales, "scales")):
        assert_claim("nvfp4.twins", actual=got.cpu().numpy(), expected=want,
                     context=f"padded {tile} {what}")


@pytest.mark.parametrize("where", ["quantize", "rht", "rht_inverse"])
def test_the_rht_refuses_a_last_dimension_not_a_multiple_of_16(device: str, where: str) -> None:
    """The RHT's groups of 16 have no padding rule: one line naming the shape and 16."""
    xb = X.astype(ml_dtypes.bfloat16)
    calls = {"quantize": (lambda m, x: m.quantize(x, (1, 16), with_rht=True)),
             "rht": (lambda m, x: m.rht(x)), "rht_inverse": (lambda m, x: m.rht_inverse(x))}
    call = calls[where]
    line = _same_error(lambda: call(rnv, xb), lambda: call(tnv, to_torch(xb, device)), where)
    assert "(5, 20)" in line and "multiple of 16" in line, line


def _rbits_cases() -> dict[str, tuple[Any, str]]:
    """name -> (rbits as the reference gets them, what the error must say came)."""
    return {"a wrong shape": (np.zeros((5, 16), np.uint8), "uint8 of shape (5, 16)"),
            "a wrong dtype": (np.zeros((5, 20), np.int32), "int32 of shape (5, 20)"),
            "the transposed shape": (np.zeros((20, 5), np.uint8), "uint8 of shape (20, 5)"),
            "a list": ([[0] * 20] * 5, "got list")}


@pytest.mark.parametrize("case", list(_rbits_cases()))
@pytest.mark.parametrize("where", ["quantize", "round_fp4_stochastic"])
def test_rbits_of_the_wrong_shape_or_dtype_name_expected_and_got(device: str, case: str,
                                                                 where: str) -> None:
    """Random bits not uint8 of x's shape: one line naming both, the same in both trees."""
    rbits, got = _rbits_cases()[case]
    t_rbits = rbits if isinstance(rbits, list) else to_torch(rbits, device)
    if where == "quantize":
        def call(m: Any, x: Any, r: Any) -> Any:
            return m.quantize(x, (1, 16), rounding="stochastic", rbits=r)
    else:
        def call(m: Any, x: Any, r: Any) -> Any:
            return m.round_fp4_stochastic(x, r)
    line = _same_error(lambda: call(rnv, X, rbits), lambda: call(tnv, to_torch(X, device),
                                                                t_rbits), f"{where} {case}")
    assert "uint8 of shape (5, 20)" in line and got in line, line


@pytest.mark.parametrize("argument,value", [("tile", (1, 32)), ("tile", (16, 1)),
                                            ("tile", "1x16"), ("rounding", "sr"),
                                            ("rounding", "nearest")])
def test_an_unknown_tile_or_rounding_lists_the_accepted_ones(device: str, argument: str,
                                                            value: Any) -> None:
    """A tile or rounding that is not the recipe's: one line listing every accepted one."""
    kwargs: dict[str, Any] = {"tile": (1, 16), argument: value}
    line = _same_error(lambda: rnv.quantize(X16, **kwargs),
                       lambda: tnv.quantize(to_torch(X16, device), **kwargs), argument)
    accepted = rnv.TILES if argument == "tile" else rnv.ROUNDINGS
    assert str(accepted) in line and repr(value) in line, line
    assert accepted == (tnv.TILES if argument == "tile" else tnv.ROUNDINGS)


def test_rbits_without_stochastic_rounding_are_refused(device: str) -> None:
    """rbits with nearest rounding, or stochastic rounding without them: one line."""
    rbits = np.zeros((5, 16), np.uint8)
    _same_error(lambda: rnv.quantize(X16, (1, 16), rbits=rbits),
                lambda: tnv.quantize(to_torch(X16, device), (1, 16),
                                     rbits=torch.from_numpy(rbits).to(device)), "rbits, RNE")
    _same_error(lambda: rnv.quantize(X16, (1, 16), rounding="stochastic"),
                lambda: tnv.quantize(to_torch(X16, device), (1, 16), rounding="stochastic"),
                "stochastic without rbits")
