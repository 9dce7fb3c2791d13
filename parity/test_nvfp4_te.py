"""reference.nvfp4 held to Transformer Engine's NVFP4 recipe written apart here
(nvfp4.te_rule): the scale chain, Four Over Six, the dequantize kernel, the RHT and the
software stochastic rounding as docs/sources/block_scaling.md section 1 reads them from TE's
source, in float64 steps rounded to float32 with ml_dtypes' casts, tile by tile on a
zero-padded copy; TE's edge cases as stated values; Four Over Six keeping the candidate of
lower error (nvfp4.four_over_six).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from parity.compare import assert_claim
from parity.strategies import nvfp4_edge_tensors
from reference import nvfp4 as rnv

TILES = ((1, 16), (16, 16))  # TE's: written here
FLT_MAX = float(np.finfo(np.float32).max)  # 0x1.fffffep127
SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1])  # TE's


def f32(v: np.ndarray | float) -> np.ndarray:
    """v (float64) rounded to float32, back in float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, np.float64).astype(np.float32).astype(np.float64)


def e4m3(v: np.ndarray) -> np.ndarray:
    """ml_dtypes' float8_e4m3fn of min(v, 448) (TE's clamp before its satfinite cast)."""
    return np.where(np.isnan(v), v, np.minimum(v, 448.0)).astype(ml_dtypes.float8_e4m3fn)


def fp4(v: np.ndarray) -> np.ndarray:
    """ml_dtypes' float4_e2m1fn of clamp(v, +-6) (TE's torch.clamp, then its table)."""
    return np.clip(v, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn)


def loop_max(values: np.ndarray) -> float:
    """max |v| element by element, a NaN propagating (torch.amax in TE's reference)."""
    top = 0.0
    for v in np.abs(values).ravel().tolist():
        if math.isnan(v):
            return math.nan
        top = max(top, v)
    return top


def te_rule(x: np.ndarray, tile: tuple[int, int], four_over_six: bool = False) -> dict:
    """TE's quantize and dequantize of float32 x, tile by tile on x zero-padded to whole
    tiles (_pad_tensor): each tile's S (float64 of the e4m3), q = f32(x R), the fp4 codes,
    the values; under Four Over Six each candidate's S and error too."""
    (m, n), r = x.shape, tile[0]
    xp = np.zeros((-(-m // r) * r, -(-n // 16) * 16))
    xp[:m, :n] = x
    a = loop_max(x)
    e_max = 256.0 if four_over_six else 448.0
    with np.errstate(divide="ignore", invalid="ignore"):
        enc = min(float(f32(np.float64(6 * e_max) / a)), FLT_MAX) if not math.isnan(a) else a
    enc = 1.0 if a == 0 or enc == 0 else enc
    dec = float(f32(np.float64(1) / enc))
    out = {k: np.zeros(xp.shape) for k in ("q", "values")}
    out["codes"] = np.zeros(xp.shape, ml_dtypes.float4_e2m1fn)
    for k in ("s", "s4", "s6", "err4", "err6"):
        out[k] = np.zeros((xp.shape[0], xp.shape[1] // 16))
    for i in range(0, xp.shape[0], r):
        for j in range(0, xp.shape[1], 16):
            block = xp[i:i + r, j:j + 16]
            amax = loop_max(block)
            if four_over_six:
                base = f32(f32(amax / 6) * enc)
                (s4, q4, c4, err4), (s6, q6, c6, err6) = (
                    candidate(block, e4m3(f32(base * 1.5)), dec, a, error=True),
                    candidate(block, e4m3(base), dec, a, error=True))
                s, q, codes = (s4, q4, c4) if err4 < err6 else (s6, q6, c6)
                out["s4"][i:i + r, j // 16], out["err4"][i:i + r, j // 16] = s4, err4
                out["s6"][i:i + r, j // 16], out["err6"][i:i + r, j // 16] = s6, err6
            else:
                s = e4m3(f32(amax * f32(enc * float(f32(1 / 6)))))
                s, q, codes, _ = candidate(block, s, dec, a)
            out["s"][i:i + r, j // 16] = s
            out["q"][i:i + r, j:j + 16], out["codes"][i:i + r, j:j + 16] = q, codes
            with np.errstate(invalid="ignore", over="ignore"):
                factor = f32(f32(float(s) * a) * float(f32(1 / (6 * e_max))))
                out["values"][i:i + r, j:j + 16] = f32(codes.astype(np.float64) * factor)
    return {k: v[:m, :n] if k in ("q", "codes", "values") else v[:m] for k, v in out.items()}


def candidate(block: np.ndarray, s: np.ndarray, dec: float, a: float, error: bool = False
              ) -> tuple:
    """(S, q, codes, error) of a block on the e4m3 scale s: R = min(f32(1 / f32(S S_dec)),
    FLT_MAX), q = f32(x R), codes fp4(q), and Four Over Six's MAE: per row the float32 sum in
    element order of |f32(f32(f32(P S) A) / 1536) - x|, a 16-row tile's rows tree-summed."""
    s = float(s)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = min(float(f32(np.float64(1) / f32(s * dec))), FLT_MAX) if not math.isnan(s) else s
        q = f32(block * r)
        codes = fp4(q)
        p = codes.astype(np.float64)
        rows = [0.0]
        for row in range(block.shape[0] if error else 0):
            err = 0.0
            for k in range(16):
                value = f32(f32(f32(p[row, k] * s) * a) / 1536.0)
                err = float(f32(err + abs(float(f32(value - block[row, k])))))
            rows.append(err)
        rows = rows[1:] or rows
        while len(rows) > 1:  # (r_i + r_i+8), then halves: _sum_4over6_2d_error
            rows = [float(f32(rows[k] + rows[k + len(rows) // 2])) for k in range(len(rows) // 2)]
    return s, q, codes, rows[0]


def decoded(scale_codes: np.ndarray) -> np.ndarray:
    return scale_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("four_over_six", [False, True])
def test_quantize_is_tes_rule_on_the_edge_tensors(tile: tuple[int, int],
                                                  four_over_six: bool) -> None:
    """Each edge class (33 x 40, padded): the reference's scales, codes (where x R is a
    number), amax and values are TE's, computed apart tile by tile."""
    for name, x in nvfp4_edge_tensors().items():
        codes, scales, amax = rnv.quantize(x, tile, four_over_six=four_over_six)
        values = rnv.dequantize(codes, scales, amax, four_over_six=four_over_six)
        want = te_rule(x, tile, four_over_six)
        number = ~np.isnan(want["q"])
        context = f"{name} tile {tile} four_over_six {four_over_six}"
        for what, got, expected in (
                ("scales", decoded(scales), want["s"].astype(np.float32)),
                ("codes", codes[number], want["codes"].view(np.uint8)[number]),
                ("amax", np.float32(amax), np.float32(loop_max(x))),
                ("values", values, want["values"].astype(np.float32))):
            assert_claim("nvfp4.te_rule", actual=got, expected=expected,
                         context=f"{context} {what}")


def te_stochastic(a: float, r8: int) -> float:
    """TE's stochastic_round_fp4_e2m1 (util/ptx.cuh), one element in float64 steps rounded to
    float32: fmaf(u, step, |a|) is one rounding of the exact u step + |a|."""
    def step(v: float) -> float:
        return 2.0 if v >= 4 else 1.0 if v >= 2 else 0.5
    mag = abs(a)
    t = float(f32(r8 / 256 * step(mag) + mag))
    q = math.floor(t / step(t)) * step(t) if math.isfinite(t) else t
    q = 6.0 if math.isnan(q) else min(q, 6.0)  # fminf drops the NaN
    return math.copysign(q, 1.0 if math.isnan(a) else a)


def test_stochastic_rounding_and_quantize_are_tes_software_rule() -> None:
    """round_fp4_stochastic on values across the fp4 range, past it, at binade ends, NaN and
    inf, and quantize(rounding='stochastic')'s codes: TE's rule element by element."""
    rng = np.random.default_rng(5)
    a = rng.uniform(-8, 8, (33, 40)).astype(np.float32)
    ends = [np.nextafter(np.float32(v), np.float32(0)) for v in (0.5, 2, 4, 6)]
    a[0, :12] = [*ends, np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 5.0, -2.5]
    rbits = rng.integers(0, 256, a.shape, dtype=np.uint8)
    rbits[0, :4] = 255  # the binade ends' largest draw: t lands on the end
    want = np.array([te_stochastic(v, r) for v, r in zip(a.ravel().tolist(),
                                                         rbits.ravel().tolist(), strict=True)])
    assert_claim("nvfp4.te_rule", actual=rnv.round_fp4_stochastic(a, rbits),
                 expected=want.reshape(a.shape).astype(np.float32), context="SR values")
    x = nvfp4_edge_tensors()["N(0, 1), rows across 2^-20..2^20"]
    codes, _, _ = rnv.quantize(x, (1, 16), rounding="stochastic", rbits=rbits)
    q = te_rule(x, (1, 16))["q"]
    want = [te_stochastic(v, r) for v, r in zip(q.ravel().tolist(), rbits.ravel().tolist(),
                                                 strict=True)]
    assert_claim("nvfp4.te_rule", actual=codes,
                 expected=np.array(want).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
                 .reshape(x.shape), context="quantize's stochastic codes")


def test_rht_is_tes_transform_where_its_sum_is_exact() -> None:
    """rht of bfloat16 groups spanning 8 binades (where the float32 sum is exact):
    bf16(x diag(s) H / 4), the product exact in float64, H Sylvester's from its formula."""
    rng = np.random.default_rng(6)
    x = rng.uniform(1, 2.0**8, (64, 64)) * rng.choice([-1, 1], (64, 64))  # 8 binades
    x = (x * np.ldexp(1.0, rng.integers(-100, 100, (64, 1)))).astype(ml_dtypes.bfloat16)
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(16)] for i in range(16)])
    m = SIGNS[:, None] * h / 4.0
    want = (x.astype(np.float64).reshape(64, 4, 16) @ m).reshape(64, 64)
    assert_claim("nvfp4.te_rule", actual=rnv.rht(x), expected=want.astype(ml_dtypes.bfloat16),
                 context="rht")


def test_tes_edge_cases_are_the_stated_values() -> None:
    """1.11: a zero tensor gives zeros; a block far below the amax gets S = 0 and codes +-6
    decoding to 0; an inf gives S_enc = 1, its block S = 448 and code 7, every value inf or
    NaN; an A of 1e-36 (below 2688 / FLT_MAX) gives S = 56 and values 8x too small."""
    zero = np.zeros((16, 32), np.float32)
    tiny = np.ones((1, 32), np.float32)
    tiny[0, 16:] = [1e-7, -1e-7] * 8  # amax 1e-7: 1e-7 * 448 / 1 rounds to e4m3 0
    inf = np.ones((1, 32), np.float32)
    inf[0, 3] = np.inf
    small = np.full((1, 16), 1e-36, np.float32)
    cases = {name: (x, *rnv.quantize(x, (1, 16))) for name, x in (
        ("zero", zero), ("tiny", tiny), ("inf", inf), ("1e-36", small))}
    got = {name: (codes, decoded(scales), rnv.dequantize(codes, scales, amax), amax)
           for name, (x, codes, scales, amax) in cases.items()}
    enc_inf, _ = rnv.global_scales(np.float32(np.inf))
    six = np.float32(6) * ((np.float32(56) * np.float32(1e-36)) * (np.float32(1) / 2688))
    truths = [  # (case, what, actual, expected)
        ("zero", "codes, scales, values", np.concatenate([got["zero"][0].ravel(),
                                                          got["zero"][1].ravel(),
                                                          got["zero"][2].ravel()]),
         np.zeros(16 * 32 * 2 + 16 * 2, np.float32)),
        ("tiny", "S", got["tiny"][1][0, 1], np.float32(0)),
        ("tiny", "codes", got["tiny"][0][0, 16:18], np.array([7, 15], np.uint8)),
        ("tiny", "values", got["tiny"][2][0, 16:], np.copysign(np.zeros(16, np.float32),
                                                              tiny[0, 16:])),  # 6 * 0, -6 * 0
        ("inf", "S_enc", enc_inf, np.float32(1)),
        ("inf", "S and code", np.array([got["inf"][1][0, 0], got["inf"][0][0, 3]]),
         np.array([448, 7], np.float32)),
        ("inf", "values inf or NaN", ~np.isfinite(got["inf"][2]), np.ones((1, 32), bool)),
        ("1e-36", "S", got["1e-36"][1][0, 0], np.float32(56)),
        ("1e-36", "values", got["1e-36"][2][0], np.full(16, six, np.float32)),
        ("1e-36", "x / value", np.float32(np.float32(1e-36) / six), np.float32(8)),
    ]
    for case, what, actual, expected in truths:
        assert_claim("nvfp4.te_rule", actual=np.asarray(actual), expected=np.asarray(expected),
                     context=f"{case}: {what}")


@pytest.mark.parametrize("tile", TILES)
def test_four_over_six_keeps_the_candidate_of_lower_error(tile: tuple[int, int]) -> None:
    """On every edge class with a finite amax: the kept candidate's error is min(err4,
    err6), and where the errors tie and the scales differ the kept scale is map 6's."""
    ties = 0
    for name, x in nvfp4_edge_tensors().items():
        if not np.isfinite(x).all():
            continue  # A = inf or NaN: every error is NaN
        _, scales, _ = rnv.quantize(x, tile, four_over_six=True)
        want = te_rule(x, tile, four_over_six=True)
        s = decoded(scales).astype(np.float64)
        kept = np.where(s == want["s6"], want["err6"], want["err4"])
        assert_claim("nvfp4.four_over_six", actual=kept.astype(np.float32),
                     expected=np.minimum(want["err4"], want["err6"]).astype(np.float32),
                     context=f"{name} tile {tile} kept error")
        tie = (want["err4"] == want["err6"]) & (want["s4"] != want["s6"])
        ties += int(tie.sum())
        assert_claim("nvfp4.four_over_six", actual=s[tie].astype(np.float32),
                     expected=want["s6"][tie].astype(np.float32), context=f"{name} tie")
    assert ties > 0  # the tie edge was reached
