"""NVFP4 training quantization as Transformer Engine's recipe does it (NVFP4BlockScaling).

NVFP4 holds a value as a float4_e2m1fn code P (0, .5, 1, 1.5, 2, 3, 4, 6 and their
negatives), one float8_e4m3fn scale S per 16 values and one float32 amax A per tensor.
Transformer Engine's recipe (transformer_engine/common/recipe/__init__.py NVFP4BlockScaling;
its reference quantizer transformer_engine/pytorch/custom_recipes/reference_nvfp4.py; the
kernels common/cast/nvfp4/*.cuh, commit d0067d0da6cb01811b8072a7d304f0e00344ce2b, read as
docs/sources/block_scaling.md section 1 records) quantizes activations and gradients in 1x16
blocks (16 consecutive values of a row) and weights in 16x16 tiles (one S per tile, stored
repeated on each of its 16 rows as TE's reference stores it: block_scales are
(M, ceil(N / 16)) for either tile). The columnwise copies of activations and gradients (the
operands of the weight-gradient GEMM) go through a random Hadamard transform first, and
gradients round stochastically.

The scale chain (1.2 to 1.5, 1.10), each step rounded once to float32 (f32), e4m3 and fp4
casts to nearest even, E = 448 (Four Over Six: 256), 6 E = 2688 (1536) exactly:

    A     = max |x|, or global_amax (another tensor's, or over ranks, or after the RHT)
    S_enc = min(f32(6 E / A), FLT_MAX), but 1 where A = 0 or S_enc = 0 (A = inf)
    S_dec = f32(1 / S_enc)
    S     = e4m3(min(f32(amax_blk * f32(S_enc * f32(1/6))), 448))   no lower clamp
    R     = min(f32(1 / f32(S * S_dec)), FLT_MAX)                    S = 0: FLT_MAX
    P_i   = fp4(clamp(f32(x_i * R), +-6)), or round_fp4_stochastic(f32(x_i * R), r_i)
    value = f32(P_i * f32(f32(S * A) * f32(1 / (6 E))))               TE's dequantize kernel

amax_blk is the max |x| over the 1x16 block or the whole 16x16 tile. Dequantize uses A / 2688,
not S_dec: the two part where the S_enc guard or clamp fired (1.11). A shape the tile does
not divide is padded with zeros, as TE's reference pads (_pad_tensor): no amax changes.

Edge cases (1.11), all from the chain above: an all-zero tensor gives S_enc = 1, every S 0,
R = FLT_MAX, codes 0 and values 0 (never NaN). A block whose S rounds to 0 (amax_blk * 448 /
A <= 2^-10) gets R = FLT_MAX: its nonzero elements saturate to +-6 and decode to 6 * 0 = 0.
An inf element gives A = inf, S_enc = 1, its block S = 448 and code +-6; dequantize then
multiplies by A = inf, so every value is inf or NaN, as TE's kernel does. A NaN propagates
through the max (TE's reference; its kernel's fmaxf drops it, unverified): every S is NaN,
and a NaN into fp4 is the zero of the opposite sign (NOTE [ NaN to a finite format ] in
reference/small_formats.py). An A below 2688 / FLT_MAX clamps S_enc, and values no longer
decode back through A / 2688 (8x too small at A = 1e-36).

Four Over Six (1.9; NVTE_NVFP4_4OVER6, E = 256): each block is quantized twice, with
S6 = e4m3(min(b, 448)) and S4 = e4m3(min(f32(b * 1.5), 448)), b = f32(f32(amax_blk / 6) *
S_enc) (this order, TE's), R_k from S_k as above; each candidate's error is the sum, element
by element in index order in float32, of |f32(f32(f32(P_i * S_k) * A) / 1536) - x_i| (MAE),
a 16x16 tile's 16 row sums added as a tree ((r_i + r_i+8), then halves); the block keeps S4
iff its error is strictly below S6's (a tie keeps S6). TE refuses it with RHT or stochastic
rounding; so does quantize.

rounding="deepgemm" swaps only the last cast, fp4(clamp(...)), for DeepGEMM's
(deep_gemm/utils/math.py, _quantize_to_fp4_e2m1, commit
54e22612409371d6364144b69086735beb54e98b, lines 73-82):

    ax = x.abs()
    # {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    # midpoints: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0
    code = torch.zeros_like(x, dtype=torch.uint8)
    for boundary in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        code += (ax > boundary).to(torch.uint8)
    sign = (x < 0) & (code != 0)
    code = code | (sign.to(torch.uint8) << 3)

The magnitude's code counts the midpoints strictly below |x|: every tie goes to the smaller
magnitude (toward zero). Nearest even agrees where the smaller neighbour is the even code
(0.25 -> 0, 1.25 -> 1, 2.5 -> 2, 5 -> 4) and parts at the other three ties: 0.75 -> 0.5 (TE
1), 1.75 -> 1.5 (TE 2), 3.5 -> 3 (TE 4). Beyond that: a result of magnitude 0 is +0 (TE
keeps the sign: -0.1 -> -0), a NaN is +0 (its comparisons are false; TE's cast: the zero of
the opposite sign, above), and no clamp is needed (|x| > 5, inf included, -> 6). DeepGEMM
pairs this cast with its own scale (amax / 6 per 1x32 or 1x128, float32 or ue8m0), not TE's
chain: here it is the rounding variant of TE's chain, the cast compared on the same scaled
values. Four Over Six, whose candidates are nearest even, refuses it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from reference import formats
from reference.mx import E4M3_MAX, F32_MAX, FP4_MAX

TILES = ((1, 16), (16, 16))  # activations and gradients; weights
ROUNDINGS = ("nearest_even", "stochastic", "deepgemm")
_DEEPGEMM_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # exact in float32
FOUR_OVER_SIX_E4M3_MAX = np.float32(256)  # TE's nvfp4_4over6_e4m3_use_256 default, 'all'
# TE's get_wgrad_sign_vector ("https://xkcd.com/221/"): bit i of 0xD7E8 set where s_i = -1
SIGN_VECTOR = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)
_SIXTH = np.float32(float.fromhex("0x1.555556p-3"))  # f32(1/6), the word 0x3E2AAAAB
_GROUP = 16  # the block's width and the RHT's size


def hadamard(n: int = 16) -> np.ndarray:
    """Sylvester's n x n Hadamard matrix, float32 entries +-1 (n a power of two):
    H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]], so H[i][j] = (-1)^popcount(i & j)."""
    if type(n) is not int or n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: n must be a power of two, got {n!r}")
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_matrix(signs: np.ndarray = SIGN_VECTOR) -> np.ndarray:
    """M = diag(s) H / 4, float32 (16, 16): every entry +-1/4, and M M^T = I (H H^T = 16 I)."""
    s = _check_signs(signs)
    return (s[:, None] * hadamard(_GROUP)) * np.float32(0.25)


def rht(x: np.ndarray, signs: np.ndarray = SIGN_VECTOR) -> np.ndarray:
    """TE's random Hadamard transform of bfloat16 x, each contiguous group of 16 along the last
    dimension (a multiple of 16): y = x M, bfloat16.

    As TE's kernel (wmma m16n16k16 .f32.bf16.bf16.f32, then cvt.rn.bf16x2.f32): each
    product x_i M_ij is exact (a bfloat16 times +-1/4), the 16 are summed in float32 from
    zero, in index order i = 0..15 here, and the sum is rounded once to bfloat16. Where the
    float32 sum is exact (the 16 terms' exponents span less than about 15 binades: 8-bit
    significands in a 24-bit sum) every order gives the same sum, so the order cannot show;
    the order inside TE's tensor-core sum is unverified, and matters only beyond that span.
    """
    return _group_product(_bf16_groups(x, "rht"), rht_matrix(signs)).reshape(np.shape(x))


def rht_inverse(y: np.ndarray, signs: np.ndarray = SIGN_VECTOR) -> np.ndarray:
    """x = y M^T per group of 16 (M orthogonal), bfloat16, by the same steps as rht: the
    round trip rounds twice to bfloat16 (claim nvfp4.rht_roundtrip bounds it)."""
    return _group_product(_bf16_groups(y, "rht_inverse"),
                          rht_matrix(signs).T).reshape(np.shape(y))


def global_scales(global_amax: np.float32 | float, e4m3_max: np.float32 = E4M3_MAX
                  ) -> tuple[np.float32, np.float32]:
    """(S_enc, S_dec) of a float32 global amax A (the module docstring): S_enc = min(f32(6 E
    / A), FLT_MAX), 1 where A = 0 or S_enc = 0; a NaN A gives NaN."""
    a = np.float32(global_amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        enc = np.minimum((FP4_MAX * np.float32(e4m3_max)) / a, F32_MAX)
    if a == 0 or enc == 0:
        enc = np.float32(1)
    return enc, np.float32(1) / enc


def block_amax(x: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """Each 16-wide block's amax, float32 (M', N' / 16), x zero-padded to whole tiles (M', N'):
    over the block's 16 values (1x16) or its whole 16x16 tile, repeated on the tile's 16 rows;
    a NaN propagates."""
    a = _pad(np.abs(x), tile)  # (M', N')
    rows, cols = a.shape
    r = tile[0]
    amax = np.max(a.reshape(rows // r, r, cols // _GROUP, _GROUP), axis=(1, 3))
    return np.repeat(amax, r, axis=0)  # (M', N' / 16)


def round_fp4_stochastic(a: np.ndarray, rbits: np.ndarray) -> np.ndarray:
    """float32 a rounded stochastically onto the fp4 grid, saturating, with one uint8 of random
    bits r per element (rbits: a's shape), as TE's software rule (util/ptx.cuh
    stochastic_round_fp4_e2m1, the 8 bits per element the hardware cvt.rs takes):

        u      = r / 256                                    exact
        step(v)= 2 if v >= 4, 1 if v >= 2, else 1/2         the grid's spacing at v
        t      = f32(|a| + u step(|a|))                     TE's fmaf: u step is exact
        q      = min(floor(t / step(t)) step(t), 6)         min drops a NaN: NaN gives 6
        result = q with a's sign (+ for NaN)

    So |a| = lo + f step (lo on the grid, 0 <= f < 1) rounds up iff r >= 256 - floor(256 f),
    with probability floor(256 f) / 256 (claim nvfp4.sr_unbiased), bar the rounding of t
    just below a binade's end.
    """
    x = _check_float32(a, "round_fp4_stochastic")
    r = _check_rbits(rbits, x.shape)
    u = r.astype(np.float32) * np.float32(1 / 256)
    mag = np.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):
        t = mag + u * _grid_step(mag)
        step_t = _grid_step(t)
        q = np.fmin(np.floor(t * (np.float32(1) / step_t)) * step_t, FP4_MAX)
    return np.copysign(q, np.where(np.isnan(x), np.float32(1), x))


def quantize(x: np.ndarray, tile: tuple[int, int], global_amax: np.float32 | float | None = None,
             *, rounding: str = "nearest_even", rbits: np.ndarray | None = None,
             four_over_six: bool = False, with_rht: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(codes, block_scales, A): the fp4 codes uint8 (M, N), the e4m3 scale codes uint8
    (M, ceil(N / 16)) and the global amax float32 of a float32 or bfloat16 (M, N) x, by the
    module docstring's chain; tile one of TILES; rounding "stochastic" takes rbits (uint8,
    x's shape); with_rht transforms bfloat16 x first (rht) and takes A after it."""
    a = _check(x, tile, rounding, rbits, four_over_six, with_rht)
    if with_rht:
        a = rht(x).astype(np.float32)
    m, n = a.shape
    blocks = _blocks(_pad(a, tile))  # (M', N' / 16, 16)
    amax = block_amax(a, tile)  # (M', N' / 16)
    top = np.max(np.abs(a)) if global_amax is None else np.float32(global_amax)
    if four_over_six:
        codes, scales = _four_over_six(blocks, amax, top, tile)
    else:
        enc, dec = global_scales(top)
        with np.errstate(over="ignore", invalid="ignore"):
            b = np.minimum(amax * (enc * _SIXTH), E4M3_MAX)  # NaN stays NaN
        scales = formats.encode(b, "float8_e4m3fn")
        r = _encode_scale(scales, dec)
        codes = _round(blocks, r, rounding, rbits)
    return codes.reshape(blocks.shape[0], -1)[:m, :n], scales[:m], np.float32(top)


def dequantize(codes: np.ndarray, block_scales: np.ndarray, global_amax: np.float32 | float,
               *, four_over_six: bool = False) -> np.ndarray:
    """float32 values f32(P_i * f32(f32(S * A) * f32(1 / (6 E)))) (TE's dequantize kernel: A
    / 2688, or / 1536 under Four Over Six), of codes (M, N) and block_scales (M, ceil(N / 16))."""
    p = formats.decode(np.asarray(codes), "float4_e2m1fn", dtype=np.float32)
    s = formats.decode(np.asarray(block_scales), "float8_e4m3fn", dtype=np.float32)
    if p.ndim != 2 or s.shape != (p.shape[0], -(-p.shape[1] // _GROUP)):
        raise ValueError(f"dequantize: codes {tuple(p.shape)} and block_scales "
                         f"{tuple(s.shape)} do not match (M, N) and (M, ceil(N / 16))")
    e4m3_max = FOUR_OVER_SIX_E4M3_MAX if four_over_six else E4M3_MAX
    with np.errstate(over="ignore", invalid="ignore"):
        factor = (s * np.float32(global_amax)) * (np.float32(1) / (FP4_MAX * e4m3_max))
        return p * np.repeat(factor, _GROUP, axis=1)[:, : p.shape[1]]


def _four_over_six(blocks: np.ndarray, amax: np.ndarray, top: np.float32,
                   tile: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(codes (M', N' / 16, 16), scales (M', N' / 16)): each block's candidate of lower error."""
    enc, dec = global_scales(top, FOUR_OVER_SIX_E4M3_MAX)
    denominator = FP4_MAX * FOUR_OVER_SIX_E4M3_MAX  # 1536
    with np.errstate(over="ignore", invalid="ignore"):
        base = (amax / FP4_MAX) * enc
        candidates = []
        for b in (np.minimum(base * np.float32(1.5), E4M3_MAX), np.minimum(base, E4M3_MAX)):
            scales = formats.encode(b, "float8_e4m3fn")  # map to 4, then map to 6
            codes = _round(blocks, _encode_scale(scales, dec), "nearest_even", None)
            s = formats.decode(scales, "float8_e4m3fn", dtype=np.float32)
            p = formats.decode(codes, "float4_e2m1fn", dtype=np.float32)
            diff = np.abs((((p * s[..., None]) * top) / denominator) - blocks)
            error = np.zeros(amax.shape, np.float32)
            for i in range(_GROUP):  # element order, as TE's __fadd_rn loop
                error = error + diff[..., i]
            candidates.append((codes, scales, _tile_error(error, tile)))
    (codes4, scales4, error4), (codes6, scales6, error6) = candidates
    with np.errstate(invalid="ignore"):
        pick4 = error4 < error6  # strict: a tie (or a NaN) keeps map to 6
    return np.where(pick4[..., None], codes4, codes6), np.where(pick4, scales4, scales6)


def _tile_error(error: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """A 16x16 tile's error: its 16 row errors added as TE's warp reduction adds them
    (_sum_4over6_2d_error: rows i and i + 8, then i and i + 4, ...), on each of its rows."""
    if tile[0] == 1:
        return error
    rows = error.reshape(-1, _GROUP, error.shape[-1])  # (M' / 16, 16, N' / 16)
    with np.errstate(over="ignore", invalid="ignore"):
        while rows.shape[1] > 1:
            half = rows.shape[1] // 2
            rows = rows[:, :half] + rows[:, half:]
    return np.repeat(rows[:, 0], _GROUP, axis=0)


def _encode_scale(scales: np.ndarray, dec: np.float32) -> np.ndarray:
    """R = min(f32(1 / f32(S * S_dec)), FLT_MAX) of e4m3 scale codes (S = 0: FLT_MAX)."""
    s = formats.decode(scales, "float8_e4m3fn", dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return np.minimum(np.float32(1) / (s * dec), F32_MAX)


def _round(blocks: np.ndarray, r: np.ndarray, rounding: str, rbits: np.ndarray | None
           ) -> np.ndarray:
    """fp4 codes of f32(x * R): nearest even after the clamp to +-6 (which keeps a NaN), or
    TE's stochastic rounding on rbits zero-padded to the blocks' shape."""
    with np.errstate(over="ignore", invalid="ignore"):  # x FLT_MAX: inf; inf 0 (A = 0): NaN
        q = blocks * r[..., None]  # (M', N' / 16, 16)
    shape = blocks.shape
    if rounding == "nearest_even":
        return formats.encode(np.clip(q, -FP4_MAX, FP4_MAX), "float4_e2m1fn")
    if rounding == "deepgemm":
        return _round_deepgemm(q)
    r = np.zeros((shape[0], shape[1] * _GROUP), np.uint8)
    r[: rbits.shape[0], : rbits.shape[1]] = rbits
    return formats.encode(round_fp4_stochastic(q, r.reshape(shape)), "float4_e2m1fn")


def _round_deepgemm(q: np.ndarray) -> np.ndarray:
    """fp4 codes by DeepGEMM's _quantize_to_fp4_e2m1 (module docstring): the magnitude's code
    is the count of midpoints below |q|, the sign bit only on a nonzero magnitude."""
    with np.errstate(invalid="ignore"):  # a NaN compares false: code 0
        mag = sum((np.abs(q) > np.float32(m)).astype(np.uint8) for m in _DEEPGEMM_MIDPOINTS)
        sign = (q < 0) & (mag != 0)
    return (mag | (sign.astype(np.uint8) << 3)).astype(np.uint8)


def _grid_step(v: np.ndarray) -> np.ndarray:
    return np.where(v >= 4, np.float32(2), np.where(v >= 2, np.float32(1), np.float32(0.5)))


def _group_product(a: np.ndarray, m: np.ndarray) -> np.ndarray:
    """bfloat16 of the float32 sum, from zero, over i = 0..15 of a[..., i] * m[i, :]."""
    y = np.zeros(a.shape, np.float32)  # (..., n, 16)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(_GROUP):
            y = y + a[..., i : i + 1] * m[i]
    return y.astype(ml_dtypes.bfloat16)


def _pad(a: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """a zero-padded to whole tiles: (ceil(M / r) r, ceil(N / 16) 16)."""
    rows = -(-a.shape[0] // tile[0]) * tile[0]
    cols = -(-a.shape[1] // _GROUP) * _GROUP
    padded = np.zeros((rows, cols), np.float32)
    padded[: a.shape[0], : a.shape[1]] = a
    return padded


def _blocks(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1] // _GROUP, _GROUP)  # (M', N' / 16, 16)


def _bf16_groups(x: object, where: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != ml_dtypes.bfloat16:
        raise TypeError(f"{where}: x must be bfloat16, got {a.dtype}")
    if a.ndim == 0 or a.shape[-1] % _GROUP:
        raise ValueError(f"{where}: the last dimension of shape {tuple(a.shape)} must be a "
                         f"multiple of {_GROUP}")
    return a.astype(np.float32).reshape(*a.shape[:-1], -1, _GROUP)  # (..., n, 16), exact


def _check_signs(signs: object) -> np.ndarray:
    s = np.asarray(signs, dtype=np.float32)
    if s.shape != (_GROUP,) or not np.all(np.abs(s) == 1):
        raise ValueError(f"signs must be {_GROUP} values of +-1, got shape {tuple(s.shape)}")
    return s


def _check_float32(x: object, where: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"{where}: x must be float32, got {a.dtype}")
    return a


def _check_rbits(rbits: object, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(rbits, np.ndarray):  # a list would widen to int64: name what was given
        raise ValueError(f"rbits must be uint8 of shape {tuple(shape)}, got "
                         f"{type(rbits).__name__}")
    if rbits.dtype != np.uint8 or rbits.shape != tuple(shape):
        raise ValueError(f"rbits must be uint8 of shape {tuple(shape)}, got {rbits.dtype} of "
                         f"shape {tuple(rbits.shape)}")
    return rbits


def _check(x: object, tile: object, rounding: str, rbits: object, four_over_six: bool,
           with_rht: bool) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype not in (np.float32, ml_dtypes.bfloat16):
        raise TypeError(f"quantize: x must be float32 or bfloat16, got {a.dtype}")
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"quantize: x must be a non-empty (M, N) matrix, got shape "
                         f"{tuple(a.shape)}")
    if tile not in TILES:
        raise ValueError(f"quantize: tile must be one of {TILES}, got {tile!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"quantize: rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if (rounding == "stochastic") != (rbits is not None):
        raise ValueError("quantize: rbits are given with rounding='stochastic', and only then")
    if rbits is not None:
        _check_rbits(rbits, a.shape)
    if four_over_six and (with_rht or rounding == "stochastic"):
        raise ValueError("quantize: Four Over Six takes neither the RHT nor stochastic "
                         "rounding (TE refuses both)")
    if four_over_six and rounding == "deepgemm":
        raise ValueError("quantize: Four Over Six rounds its candidates to nearest even; "
                         "rounding='deepgemm' is refused with it")
    if with_rht:
        _bf16_groups(a, "quantize")
    return a.astype(np.float32)  # bfloat16 widens exactly
