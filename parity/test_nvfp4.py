"""NVFP4 training quantization (Transformer Engine's recipe) in both trees (nvfp4.twins) and
against the mx topic's 1x16 path (nvfp4.mx_1x16); the RHT's matrix (nvfp4.rht_orthogonal)
and its round trip (nvfp4.rht_roundtrip); stochastic rounding's exact expectation
(nvfp4.sr_unbiased). TE's rule written apart, its edge cases and Four Over Six's choice:
parity/test_nvfp4_te.py. Driver: parity/drivers/nvfp4.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import event, given

from parity.compare import as_numpy, assert_claim, assert_observed
from parity.drivers import nvfp4 as drv
from parity.strategies import examples, nvfp4_cases, nvfp4_edge_tensors
from reference import mx as rmx
from reference import nvfp4 as rnv
from torch_impl import mx as tmx
from torch_impl import nvfp4 as tnv

TILES = ((1, 16), (16, 16))  # TE's 1x16 blocks and 16x16 weight tiles: written here
CONFIGS = {  # (rounding, four_over_six, with_rht): TE's uses of each
    "rn": ("nearest_even", False, False),  # fprop input rowwise, weights
    "4over6": ("nearest_even", True, False),  # NVTE_NVFP4_4OVER6
    "rht": ("nearest_even", False, True),  # fprop input columnwise, for the wgrad GEMM
    "rht+sr": ("stochastic", False, True),  # gradient columnwise
    "sr": ("stochastic", False, False),  # gradient rowwise
}
BF16 = ml_dtypes.bfloat16


def test_nvfp4_1x16_gives_the_same_codes_scales_and_amax_in_both_trees(device: str) -> None:
    """One small tensor quantized 1x16 (TE's activations) by each tree: the same fp4 codes,
    e4m3 scale codes and global amax, bit for bit."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 64)) * 2.0 ** rng.integers(-8, 8, (4, 1))).astype(np.float32)
    ref_codes, ref_scales, ref_amax = rnv.quantize(x, rnv.TILES[0])  # (4, 64), (4, 4), ()
    torch_codes, torch_scales, torch_amax = tnv.quantize(torch.from_numpy(x).to(device),
                                                         tnv.TILES[0])  # (4, 64), (4, 4), ()
    assert_claim("nvfp4.twins", actual=torch_scales, expected=ref_scales, context="scales")
    assert_claim("nvfp4.twins", actual=torch_codes, expected=ref_codes, context="codes")
    assert_claim("nvfp4.twins", actual=torch_amax, expected=ref_amax, context="global amax")


def quantize_both(x: np.ndarray, tile: tuple[int, int], rounding: str, four_over_six: bool,
                  with_rht: bool, rbits: np.ndarray | None, device: str, context: str) -> None:
    """Quantize and dequantize x in both trees; assert nvfp4.twins on everything (codes
    wherever the value decodes to a number: a NaN's code is the zero of the NaN's opposite
    sign, and the RHT's NaN signs are the platform's)."""
    (rc, rs, ra), (tc, ts, ta) = drv.quantize(
        x, tile, device, rounding=rounding, rbits=rbits, four_over_six=four_over_six,
        with_rht=with_rht)
    ref_values, torch_values = drv.dequantize(rc, rs, ra, device, four_over_six)
    assert_claim("nvfp4.twins", actual=torch_values, expected=ref_values,
                 context=f"{context} values")
    number = ~np.isnan(ref_values)
    for what, got, want in (("codes", tc[number], rc[number]), ("scales", ts, rs),
                            ("amax", ta, np.asarray(ra))):
        assert_claim("nvfp4.twins", actual=got, expected=want, context=f"{context} {what}")


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("config", CONFIGS)
def test_edge_tensors_give_the_same_codes_scales_and_values_in_both_trees(
        tile: tuple[int, int], config: str, device: str) -> None:
    """Every edge class (33 x 40: both tiles padded), each tile and use: the same codes,
    scales, amax and decoded values in both trees."""
    rounding, four_over_six, with_rht = CONFIGS[config]
    rng = np.random.default_rng(1)
    for name, x in nvfp4_edge_tensors().items():
        x = x[:, :32].astype(BF16) if with_rht else x  # the RHT: bfloat16, groups of 16
        rbits = (rng.integers(0, 256, x.shape, dtype=np.uint8) if rounding == "stochastic"
                 else None)
        quantize_both(x, tile, rounding, four_over_six, with_rht, rbits, device,
                      f"{name} tile {tile} {config}")


@given(case=nvfp4_cases())
@examples(25)
def test_any_tensor_gives_the_same_codes_scales_and_values_in_both_trees(case: dict,
                                                                         device: str) -> None:
    """Any shape, dtype, tile, rounding and use: the same bits in both trees."""
    x = case["x"]
    event(f"a NaN or inf: {not np.isfinite(x.astype(np.float32)).all()}")
    event(f"rounding {case['rounding']}, four_over_six {case['four_over_six']}, "
          f"rht {case['with_rht']}")
    quantize_both(x, case["tile"], case["rounding"], case["four_over_six"], case["with_rht"],
                  case["rbits"], device, f"shape {x.shape} {x.dtype} tile {case['tile']}")


def test_rht_and_stochastic_rounding_give_the_same_bits_in_both_trees(device: str) -> None:
    """rht, rht_inverse and round_fp4_stochastic of every edge class (and of values spread
    over the fp4 range, past it and at its ties) on the same rbits: the same bits."""
    rng = np.random.default_rng(2)
    spread = rng.uniform(-8, 8, (33, 40)).astype(np.float32)
    spread[0, :8] = [0.25, 0.75, 2.5, 5.0, -0.0, 6.0, 7.0, -1e-30]
    for name, x in {**nvfp4_edge_tensors(), "spread over +-8": spread}.items():
        y_ref, y_torch = drv.rht(x[:, :32].astype(BF16), device)
        assert_claim("nvfp4.twins", actual=y_torch, expected=y_ref, context=f"rht {name}")
        z_ref, z_torch = drv.rht(y_ref, device, inverse=True)
        assert_claim("nvfp4.twins", actual=z_torch, expected=z_ref,
                     context=f"rht_inverse {name}")
        rbits = rng.integers(0, 256, x.shape, dtype=np.uint8)
        q_ref, q_torch = drv.round_fp4_stochastic(x, rbits, device)
        assert_claim("nvfp4.twins", actual=q_torch, expected=q_ref, context=f"SR {name}")


def test_bad_input_gets_the_same_one_line_error_in_both_trees() -> None:
    """A wrong tile, dtype, ndim, rounding, rbits (missing, wrong shape or dtype), Four Over
    Six with SR or the RHT, the RHT on float32: the same exception and message in both."""
    good, bits = np.ones((2, 32), np.float32), np.zeros((2, 32), np.uint8)
    calls = [(good, (1, 32), {}), (good, (16, 1), {}), (good.astype(np.float64), (1, 16), {}),
             (good[0], (1, 16), {}), (good, (1, 16), {"rounding": "nearest_away"}),
             (good, (1, 16), {"rounding": "stochastic"}), (good, (1, 16), {"rbits": bits}),
             (good, (1, 16), {"rounding": "stochastic", "rbits": bits[:, :16]}),
             (good, (1, 16), {"rounding": "stochastic", "rbits": bits.astype(np.int16)}),
             (good, (16, 16), {"four_over_six": True, "rounding": "stochastic", "rbits": bits}),
             (good.astype(BF16), (1, 16), {"four_over_six": True, "with_rht": True}),
             (good, (1, 16), {"with_rht": True}), (good[:, :20].astype(BF16), (1, 16),
                                                   {"with_rht": True})]
    pairs = [(lambda x=x, t=t, o=o: rnv.quantize(x, t, **o),
              lambda x=x, t=t, o=o: tnv.quantize(drv.to_torch(x), t, **{
                  **o, "rbits": drv.to_torch(o.get("rbits"))})) for x, t, o in calls]
    pairs += [(lambda: rnv.round_fp4_stochastic(good, bits[:, :3]),
               lambda: tnv.round_fp4_stochastic(drv.to_torch(good), drv.to_torch(bits[:, :3]))),
              (lambda: rnv.rht(good), lambda: tnv.rht(drv.to_torch(good)))]
    for ref_call, torch_call in pairs:
        with pytest.raises((TypeError, ValueError)) as ref_error:
            ref_call()
        with pytest.raises((TypeError, ValueError)) as torch_error:
            torch_call()
        assert type(ref_error.value) is type(torch_error.value)
        assert str(ref_error.value) == str(torch_error.value)
        assert "\n" not in str(ref_error.value)


@pytest.mark.parametrize("tree", ["reference", "torch"])
def test_the_1x16_path_is_the_mx_topics_nvfp4(tree: str, device: str) -> None:
    """quantize(tile (1, 16)) gives mx.to_nvfp4's codes and scales and dequantize
    mx.from_nvfp4's values, each tree against its own mx, on every edge class."""
    for name, x in nvfp4_edge_tensors().items():
        x = x[:, :32]  # mx takes whole blocks
        if tree == "reference":
            codes, scales, amax = rnv.quantize(x, (1, 16))
            values, mx = rnv.dequantize(codes, scales, amax), rmx.to_nvfp4(x)
            want_values = rmx.from_nvfp4(mx)
        else:
            t = torch.from_numpy(x).to(device)
            codes, scales, amax = tnv.quantize(t, (1, 16))
            values, mx = tnv.dequantize(codes, scales, amax), tmx.to_nvfp4(t)
            want_values = tmx.from_nvfp4(mx)
        for what, got, want in (("codes", codes, mx.elements), ("scales", scales, mx.scales),
                                ("values", values, want_values)):
            assert_claim("nvfp4.mx_1x16", actual=as_numpy(got), expected=as_numpy(want),
                         context=f"{tree} {name} {what}")


def test_the_rht_matrix_is_tes_and_orthogonal_exactly(device: str) -> None:
    """hadamard(16) is Sylvester's, SIGN_VECTOR TE's (the mask 0xD7E8), M's entries +-1/4,
    and M M^T = I exactly, in both trees."""
    signs = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)
    sylvester = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)]
                          for i in range(16)], np.float32)
    trees = {"reference": (rnv.hadamard(16), rnv.SIGN_VECTOR, rnv.rht_matrix()),
             "torch": (tnv.hadamard(16), tnv.SIGN_VECTOR,
                       tnv.rht_matrix(tnv.SIGN_VECTOR.to(device)))}
    for tree, (h, s, m) in trees.items():
        h, s, m = as_numpy(h), as_numpy(s), as_numpy(m)
        mask = sum(1 << i for i in range(16) if s[i] < 0)
        for what, got, want in (
                ("H", h, sylvester), ("signs", s, signs),
                ("sign mask", np.array(mask), np.array(0xD7E8)),
                ("|M|", np.abs(m), np.full((16, 16), 0.25, np.float32)),
                ("M M^T", m.astype(np.float64) @ m.T.astype(np.float64), np.eye(16))):
            assert_claim("nvfp4.rht_orthogonal", actual=got, expected=want,
                         context=f"{tree} {what}")


def test_rht_inverse_recovers_x_within_two_bfloat16_roundings(device: str) -> None:
    """bfloat16 groups of 16 with max |x| from 2^-100 to 2^119, some spread over 40 binades
    inside the group (so the float32 sums are inexact): rht_inverse(rht(x)) is x within
    nvfp4.rht_roundtrip's bound, in units of eps(bfloat16) times the group's max |x|."""
    rng = np.random.default_rng(3)
    top = rng.integers(-99, 119, (256, 4, 1))  # (rows, groups, 1): each group's binade
    spread = np.where(rng.random((256, 4, 1)) < 0.25, 40, 3)
    e = top - rng.integers(0, spread + 1, (256, 4, 16))
    x = rng.uniform(-2, 2, (256, 4, 16)) * np.ldexp(1.0, e)
    x[..., :1] = 1.5 * np.ldexp(1.0, top)  # G in [1.5, 2] 2^top
    x = x.astype(BF16).reshape(256, 64)
    g = np.max(np.abs(x.astype(np.float32)).reshape(256, 4, 16), axis=-1, keepdims=True)
    g = np.broadcast_to(g, (256, 4, 16)).reshape(256, 64)  # each element's group's max |x|
    assert (g >= 2.0**-100).all() and (g <= 2.0**120).all()  # the claim's range
    xt = drv.to_torch(x, device)
    for tree, z in (("reference", rnv.rht_inverse(rnv.rht(x))),
                    ("torch", tnv.rht_inverse(tnv.rht(xt)))):
        assert_claim("nvfp4.rht_roundtrip", actual=as_numpy(z), expected=x, scale=g,
                     context=tree)


GRID = (0, Fraction(1, 2), 1, Fraction(3, 2), 2, 3, 4, 6)  # e2m1's magnitudes
SR_VALUES = (0.5 + 0.5 / 256, 2 + 255 / 256, 1.25, 3.0, 4 + 2 * 100.5 / 256, 5.0, 0.1, -1.7)
SR_DRAWS = 2**20


def kl(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)), 0 ln 0 = 0."""
    return sum(a * math.log(a / b) for a, b in ((q, p), (1 - q, 1 - p)) if a > 0)


def binomial_p_value(k: int, n: int, p: float) -> float:
    """A bound on the two-sided p-value of k successes in n Binomial(n, p) draws: Chernoff's
    exp(-n KL(p + d || p)) + exp(-n KL(p - d || p)), d = |k / n - p|."""
    if p in (0.0, 1.0):
        return 1.0 if k == n * p else 0.0
    d = abs(k / n - p)
    return min(1.0, sum(math.exp(-n * kl(q, p)) for q in (p + d, p - d) if 0 <= q <= 1))


def test_stochastic_rounding_has_its_exact_expectation() -> None:
    """Each a of SR_VALUES over 2^20 seeded draws: the up-count is Binomial(n, floor(256 f) /
    256) (so E[q] = lo + step floor(256 f) / 256, a up to the draw's 1/256), by the
    Bonferroni-adjusted p-value nvfp4.sr_unbiased states."""
    rng = np.random.default_rng(4)
    p_values, away = [], []
    for a in SR_VALUES:
        a32 = np.float32(a)
        mag = Fraction(abs(float(a32)))
        lo = max(v for v in GRID if v <= mag)
        step = min(v for v in GRID if v > lo) - lo
        up = math.floor(256 * (mag - lo) / step)  # draws r >= 256 - up round up
        for r in range(256):  # t = f32(|a| + u step) is in the step |a| + u step is in
            t = np.float32(abs(a32)) + np.float32(r / 256) * np.float32(float(step))
            assert (Fraction(float(t)) >= lo + step) == (mag + Fraction(r, 256) * step >=
                                                         lo + step)
        q = rnv.round_fp4_stochastic(np.full(SR_DRAWS, a32),
                                     rng.integers(0, 256, SR_DRAWS, dtype=np.uint8))
        k = int(np.count_nonzero(np.abs(q) == np.float32(lo + step)))
        others = int(np.count_nonzero((np.abs(q) != np.float32(lo)) & (np.abs(q) !=
                                                                       np.float32(lo + step))))
        p_values.append(0.0 if others else binomial_p_value(k, SR_DRAWS, up / 256))
        away.append(f"{a}: E[q] - a = {float((lo + step * Fraction(up, 256)) - mag):+.3g}")
    assert_observed("nvfp4.sr_unbiased", min(1.0, len(SR_VALUES) * min(p_values)),
                    n=len(SR_VALUES) * SR_DRAWS, context="; ".join(away))
