"""reference.mx against its own oracles: the scale rule's docstring pseudocode (compiled as it
stands), exact rational rounding for the ties-away elements, the formats' identities (the
scaled amax of each mode lies where the mode says), the fp4 packing, and the refusals of bad
input in both trees (the same messages: a ValueError or TypeError naming the problem).
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from pseudocode import pseudocode

from common.mx_ranges import VARIANT_RANGES
from reference import mx as rmx
from reference.formats import FORMATS, decode
from torch_impl import mx as tmx


def _word(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


SCALE_RULE = pseudocode(rmx.scale_codes.__doc__, "scale_rule", word=_word)


def _amaxes(top: float) -> np.ndarray:
    """Positive float32 amaxes: 0, subnormals, every power of two and its neighbours, the
    element max `top` scaled by powers of two and its neighbours, random words, inf, NaN."""
    rng = np.random.default_rng(0)
    pows = np.array([np.float32(2.0**k).view(np.int32) for k in range(-149, 128)], np.int64)
    tops = np.array([np.float32(top * 2.0**k).view(np.int32) for k in range(-140, 112)],
                    np.int64)
    words = np.concatenate([(pows[:, None] + np.arange(-2, 3)).ravel(),
                            (tops[:, None] + np.arange(-1, 4)).ravel(),
                            rng.integers(1, 0x7F800000, 400), [0, 1, 0x7F800000, 0x7FC00000]])
    words = words[(words >= 0) & (words <= 0x7FC00000)]
    return words.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize(("variant", "mode"), [
    (variant, mode) for variant, taken in VARIANT_RANGES.items() for mode in taken.modes])
@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_scale_codes_follow_the_docstring_pseudocode(fmt: str, mode: str, variant: str
                                                     ) -> None:
    """Every amax of _amaxes (about 2,700, +inf and NaN among them): scale_codes gives
    scale_rule's code, for every variant and each scale mode it takes."""
    if fmt not in VARIANT_RANGES[variant].formats:
        pytest.skip(f"the {variant} variant does not take {fmt}")
    spec = FORMATS[fmt]
    amax = _amaxes(spec.max)
    expected = [SCALE_RULE(float(a), mode, spec.emax, spec.mantissa_bits, spec.max, variant)
                for a in amax]
    assert np.array_equal(rmx.scale_codes(amax, fmt, mode, variant),
                          np.array(expected, np.uint8))


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_each_mode_places_the_scaled_amax_where_it_says(fmt: str) -> None:
    """For normal amax: floor and even give scaled amax in [2^e_max, 2^(e_max+1)) (even:
    after its rounding), ceil in (2^(e_max-1), 2^e_max], rceil in (max/2, max]."""
    spec = FORMATS[fmt]
    rng = np.random.default_rng(1)
    amax = np.ldexp(1 + rng.random(2000), rng.integers(-100, 100, 2000)).astype(np.float32)
    x = np.zeros((2000, 32), np.float32)
    x[:, 0] = amax
    q = {m: rmx.scaled_blocks(x, fmt, m)[1][:, 0, 0].astype(np.float64) for m in rmx.SCALE_MODES}
    assert np.all((q["floor"] >= 2.0**spec.emax) & (q["floor"] < 2.0 ** (spec.emax + 1)))
    assert np.all((q["ceil"] > 2.0 ** (spec.emax - 1)) & (q["ceil"] <= 2.0**spec.emax))
    assert np.all((q["rceil"] > spec.max / 2) & (q["rceil"] <= spec.max))
    assert np.all((q["even"] >= 2.0 ** (spec.emax - 1)) & (q["even"] < 2.0 ** (spec.emax + 1)))
    assert np.any(q["floor"] > spec.max), "guard: floor clips some"


def _round_away_exact(q: np.ndarray, members: np.ndarray) -> np.ndarray:
    """The member nearest each q (|q| <= max), ties away from zero, by exact rationals on
    the two members around |q|."""
    out = []
    for v in q.astype(np.float64):
        i = int(np.searchsorted(members, abs(v)))
        lo, hi = members[max(i - 1, 0)], members[min(i, len(members) - 1)]
        t = Fraction(abs(v))
        best = hi if abs(Fraction(hi) - t) <= abs(t - Fraction(lo)) else lo
        out.append(math.copysign(best, v))
    return np.array(out)


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_ties_away_rounding_is_the_exact_nearest_member_ties_away(fmt: str) -> None:
    """Every midpoint between two members (and random values) of fmt, both signs."""
    spec = FORMATS[fmt]
    members = np.unique(decode(np.arange(spec.max_code + 1, dtype=np.uint8), fmt))
    mids = (members[:-1] + members[1:]) / 2
    rng = np.random.default_rng(2)
    q = np.concatenate([mids, -mids, rng.uniform(-spec.max, spec.max, 300)]).astype(np.float32)
    got = decode(rmx.round_elements(q, fmt, "nearest_away"), fmt)
    want = _round_away_exact(q, members)
    assert np.array_equal(got, want)
    even = decode(rmx.round_elements(q, fmt), fmt)
    assert np.any(even != got), "guard: some midpoint rounds to even, not away"


def test_fp4_packing_puts_the_first_element_in_the_low_nibble_and_unpacks() -> None:
    codes = np.arange(16, dtype=np.uint8).reshape(2, 8)
    packed = rmx.pack_fp4(codes)
    assert packed[0, 0] == 0x10 and packed[1, 3] == 0xFE
    assert np.array_equal(rmx.unpack_fp4(packed), codes)
    assert torch.equal(tmx.unpack_fp4(tmx.pack_fp4(torch.from_numpy(codes))),
                       torch.from_numpy(codes))


def test_from_mx_decodes_members_exactly() -> None:
    """A block already made of scaled members comes back as it went in (ceil, e4m3)."""
    x = decode(np.arange(0x30, 0x50, dtype=np.uint8), "float8_e4m3fn", np.float32)  # 1/2..7.5
    x = (x * 2.0**-10).astype(np.float32).reshape(1, 32)  # ceil: the scale 2^-15, q <= 240
    assert np.array_equal(rmx.from_mx(rmx.to_mx(x, "float8_e4m3fn", "ceil")), x)


BAD = [
    (dict(fmt="float16"), ValueError, "unknown MX element format"),
    (dict(mode="round"), ValueError, "unknown scale mode"),
    (dict(rounding="stochastic"), ValueError, "unknown rounding"),
    (dict(variant="nvidia"), ValueError, "unknown MX variant 'nvidia'; known: ocp, torchao, "
     "microxcaling, microxcaling_cpp, transformer_engine"),
    (dict(block_size=0), ValueError, "block_size must be a positive int"),
    (dict(shape=(4, 48)), ValueError, "must be divisible by the block size 32"),
    (dict(dtype="float64"), TypeError, "float32 or bfloat16"),
]


@pytest.mark.parametrize("tree", ["reference", "torch"])
@pytest.mark.parametrize(("bad", "error", "message"), BAD)
def test_bad_input_is_refused_naming_the_problem(tree: str, bad: dict, error: type,
                                                 message: str) -> None:
    with pytest.raises(error, match=message):
        _to_mx(tree, bad)


def _to_mx(tree: str, bad: dict) -> object:
    args = {"fmt": "float8_e4m3fn", "mode": "floor", "rounding": "nearest_even",
            "block_size": 32, "shape": (4, 64), "dtype": "float32", "variant": "ocp"} | bad
    x = np.ones(args["shape"], dtype=args["dtype"])
    module, data = (rmx, x) if tree == "reference" else (tmx, torch.from_numpy(x))
    return module.to_mx(data, args["fmt"], args["mode"], block_size=args["block_size"],
                        rounding=args["rounding"], variant=args["variant"])


@pytest.mark.parametrize(("bad", "error", "message"), BAD[:-1])  # a dtype is the tree's own
def test_both_trees_refuse_bad_input_with_the_same_line(bad: dict, error: type, message: str
                                                        ) -> None:
    lines = []
    for tree in ("reference", "torch"):
        with pytest.raises(error) as refused:
            _to_mx(tree, bad)
        lines.append(str(refused.value))
    assert lines[0] == lines[1], lines


@pytest.mark.parametrize("tree", ["reference", "torch"])
def test_nvfp4_refuses_a_last_dimension_not_a_multiple_of_16(tree: str) -> None:
    x = np.ones((2, 24), np.float32)
    module, data = (rmx, x) if tree == "reference" else (tmx, torch.from_numpy(x))
    with pytest.raises(ValueError, match="divisible by the block size 16"):
        module.to_nvfp4(data)


def test_nvfp4_per_tensor_scale_is_amax_over_2688_rounded_once() -> None:
    """g = f32(amax / 2688) against exact rationals (2688 = 448 * 6), for amaxes across the
    float32 range; the division is rounded once, as float32 division is."""
    rng = np.random.default_rng(3)
    for amax in np.ldexp(1 + rng.random(200), rng.integers(-120, 127, 200)).astype(np.float32):
        x = np.array([[amax] + [0.0] * 15], np.float32)
        exact = Fraction(float(amax)) / 2688
        g = float(rmx.per_tensor_scale(x))
        below, above = np.nextafter(np.float32(g), np.float32(0)), np.nextafter(
            np.float32(g), np.float32(np.inf))
        assert abs(Fraction(g) - exact) <= abs(Fraction(float(below)) - exact)
        assert abs(Fraction(g) - exact) <= abs(Fraction(float(above)) - exact)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"variant": "nvidia"}, "unknown NVFP4 variant 'nvidia'; known: transformer_engine, torchao"),
    ({"per_tensor": 0.5}, "the transformer_engine variant takes only its own"),
    ({"variant": "torchao", "global_amax": 2.0}, "the torchao variant takes only its own"),
])
def test_nvfp4_refuses_another_variants_argument_with_the_same_line_in_both_trees(
        kwargs: dict, message: str) -> None:
    x = np.ones((2, 32), np.float32)
    lines = []
    for module, data, wrap in ((rmx, x, np.float32), (tmx, torch.from_numpy(x), torch.tensor)):
        given = {k: wrap(v) if k in ("per_tensor", "global_amax") else v
                 for k, v in kwargs.items()}
        with pytest.raises(ValueError, match=message) as refused:
            module.to_nvfp4(data, **given)
        lines.append(str(refused.value))
    assert lines[0] == lines[1]
