"""Quick checks of the formats claims for `python -m parity report` (see parity/test_formats.py).

Inputs are deterministic: every code of the 8-bit formats, a seeded sample of the 16-bit
ones, their exact ties and the float32 values one and two ulps either side, plus seeded
random bit patterns. Members and ties come from parity.strategies.member_value (exact
Python arithmetic), not from the reference under test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import torch

import reference.formats as ref
import torch_impl.formats as tim
from parity.compare import measure
from parity.report import Observation, check, picture
from parity.strategies import member_value
from parity.sweep import ML_DTYPES, sweep_sample
from parity.tolerances import claim

ALL_FORMATS = ("float32", "tf32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")
TORCH_DTYPE_FORMATS = ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn")
RANGE_FIELDS = ("bits", "eps", "max", "tiny", "smallest_subnormal", "max_exponent",
                "min_exponent", "mantissa_bits", "exponent_bits", "unit_roundoff")


def exact_nearest_even(x: float, fmt: ref.FloatFormat) -> float:
    """The oracle: round the exact rational value of x, ties to even; overflow (and +-inf)
    to inf in IEEE formats, to +-max in fn formats (overflow="saturate")."""
    if math.isinf(x) and fmt.convention == "fn":
        return math.copysign(fmt.max, x)
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    a = Fraction(abs(x))
    e = max(math.frexp(abs(x))[1] - 1, fmt.min_exponent)
    spacing = Fraction(2) ** (e - fmt.mantissa_bits)
    kept, rest = divmod(a, spacing)
    if rest > spacing / 2 or (rest == spacing / 2 and kept % 2 == 1):
        kept += 1
    value = kept * spacing
    if value > Fraction(fmt.max):
        return math.copysign(math.inf if fmt.convention == "ieee" else fmt.max, x)
    return math.copysign(float(value), x)


def edge_inputs(name: str, n_codes: int = 2048, seed: int = 0) -> np.ndarray:
    """float32 members, ties, +-1 and +-2 float32 ulps around ties, specials, random bits."""
    fmt = ref.FORMATS[name]
    rng = np.random.default_rng(seed)
    top = fmt.max_code
    codes = np.arange(top + 1) if top < n_codes else rng.integers(0, top, n_codes)
    lo = np.array([member_value(fmt, int(c)) for c in codes])
    hi = np.array([member_value(fmt, int(c) + 1) if c < top else
                   fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits) for c in codes])
    with np.errstate(over="ignore"):  # float32's own ties lie beyond its range at the top
        ties = ((lo + hi) / 2).astype(np.float32)
        up = np.nextafter(ties, np.float32(np.inf))
        down = np.nextafter(ties, np.float32(-np.inf))
        near = [up, down, np.nextafter(up, np.float32(np.inf)),
                np.nextafter(down, np.float32(-np.inf))]
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fmt.tiny, fmt.smallest_subnormal,
                         fmt.smallest_subnormal / 2], dtype=np.float32)
    bits = rng.integers(0, 2**32, size=4096, dtype=np.uint32).view(np.float32)
    x = np.concatenate([lo.astype(np.float32), ties, *near, specials, bits])
    return np.concatenate([x, -x])


def edge_inputs_float64(name: str, seed: int = 0) -> np.ndarray:
    """float64 ties moved by a few float64 ulps (double-rounding cases), and random doubles."""
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        x32 = edge_inputs(name, n_codes=512, seed=seed).astype(np.float64)
    rng = np.random.default_rng(seed)
    finite = x32[np.isfinite(x32) & (x32 != 0)]
    with np.errstate(over="ignore"):
        moved = finite + np.spacing(finite) * rng.integers(-3, 4, finite.size) * \
            2.0 ** rng.integers(0, 21, finite.size)
    doubles = rng.integers(0, 2**64, size=2048, dtype=np.uint64).view(np.float64)
    return np.concatenate([x32, moved, doubles])


def _values(codes: torch.Tensor, name: str) -> np.ndarray:
    return tim.decode(codes, name).numpy()


def _worst(claim_id: str, pairs: list[tuple[np.ndarray, np.ndarray]]) -> Observation:
    c = claim(claim_id)
    return Observation(max(measure(c, a, b) for a, b in pairs), sum(a.size for a, _ in pairs))


@check("formats.ranges")
def _() -> Observation:
    pairs = []
    for name in ALL_FORMATS:
        r = np.array([float(getattr(ref.FORMATS[name], f)) for f in RANGE_FIELDS])
        pairs.append((r, np.array([float(getattr(tim.FORMATS[name], f)) for f in RANGE_FIELDS])))
        if name in ML_DTYPES:
            fi = ml_dtypes.finfo(ML_DTYPES[name])
            ml = [fi.bits, fi.eps, fi.max, fi.smallest_normal, fi.smallest_subnormal,
                  fi.maxexp, fi.minexp, fi.nmant, fi.nexp, float(fi.eps) / 2]
            pairs.append((r, np.array([float(v) for v in ml])))
    return _worst("formats.ranges", pairs)


@check("formats.decode")
def _() -> Observation:
    pairs = []
    for name in TORCH_DTYPE_FORMATS:
        fmt = ref.FORMATS[name]
        codes = np.arange(2**fmt.bits, dtype=fmt.code_dtype)
        expected = ref.decode(codes, name)
        pairs.append((_values(torch.from_numpy(codes), name), expected))
        with np.errstate(invalid="ignore"):  # signalling NaN codes raise "invalid" on widening
            pairs.append((codes.view(ML_DTYPES[name]).astype(np.float64), expected))
    return _worst("formats.decode", pairs)


@check("formats.encode_f32")
def _() -> Observation:
    pairs = []
    for name in ALL_FORMATS:
        x = edge_inputs(name)
        policy = tim.DEFAULT_OVERFLOW[name]
        got = ref.decode(ref.encode(x, name, overflow=policy), name)
        pairs.append((got, _values(tim.encode(torch.from_numpy(x), name), name)))
        if name in ML_DTYPES:
            got_ml = ref.decode(ref.encode(x, name, overflow="nan" if name == "float8_e4m3fn"
                                           else policy), name)
            with np.errstate(over="ignore", invalid="ignore"):  # overflow is the subject
                pairs.append((got_ml, x.astype(ML_DTYPES[name]).astype(np.float64)))
    return _worst("formats.encode_f32", pairs)


@check("formats.encode_f64_correct")
def _() -> Observation:
    pairs = []
    for name in ALL_FORMATS:
        fmt = ref.FORMATS[name]
        x = edge_inputs_float64(name)
        overflow = "inf" if fmt.convention == "ieee" else "saturate"
        oracle = np.array([exact_nearest_even(v, fmt) for v in x.tolist()])
        pairs.append((ref.quantize(x, name, overflow=overflow), oracle))
        pairs.append((tim.quantize(torch.from_numpy(x), name, overflow=overflow).numpy(), oracle))
    return _worst("formats.encode_f64_correct", pairs)


@check("formats.encode_f64_via_f32")
def _() -> Observation:
    pairs = []
    for name in TORCH_DTYPE_FORMATS:
        x = edge_inputs_float64(name)
        native = torch.from_numpy(x).to(tim.FORMATS[name].dtype).to(torch.float64).numpy()
        got = ref.quantize(x, name, via="float32", overflow=tim.DEFAULT_OVERFLOW[name])
        pairs.append((got, native))
    return _worst("formats.encode_f64_via_f32", pairs)


@check("formats.toward_zero")
def _() -> Observation:
    pairs = []
    for name in ALL_FORMATS:
        for x in (edge_inputs(name), edge_inputs_float64(name)):
            for overflow in ("saturate", "nan"):
                got = ref.quantize(x, name, rounding="toward_zero", overflow=overflow)
                expected = tim.quantize(torch.from_numpy(x), name, rounding="toward_zero",
                                        overflow=overflow)
                pairs.append((got, expected.numpy()))
    return _worst("formats.toward_zero", pairs)


@check("formats.stochastic_bits")
def _() -> Observation:
    pairs = []
    rng = np.random.default_rng(1)
    for name in ALL_FORMATS:
        for x in (edge_inputs(name), edge_inputs_float64(name)):
            words = ref.draw_random_words(x.shape, rng)
            got = ref.quantize(x, name, rounding="stochastic", random_bits=words)
            expected = tim.quantize(torch.from_numpy(x), name, rounding="stochastic",
                                    random_bits=torch.from_numpy(words.astype(np.int64)))
            pairs.append((got, expected.numpy()))
    return _worst("formats.stochastic_bits", pairs)


def stochastic_p_value(x: float, name: str, rounded: np.ndarray) -> float:
    """Two-sided p-value of the mean of stochastic roundings of x under E[q(x)] = x."""
    fmt = ref.FORMATS[name]
    spacing = 2.0 ** (max(math.frexp(abs(x))[1] - 1, fmt.min_exponent) - fmt.mantissa_bits)
    lo = math.floor(abs(x) / spacing) * spacing  # exact: scaling by powers of two
    p = (abs(x) - lo) / spacing
    magnitudes = np.abs(rounded.astype(np.float64))
    if not set(np.unique(magnitudes).tolist()) <= {lo, lo + spacing} or not 0 < p < 1:
        return 0.0  # a result that is not a neighbour, or a useless input: fail loudly
    sigma = math.sqrt(p * (1 - p)) * spacing
    z = abs(float(np.mean(magnitudes)) - abs(x)) / (sigma / math.sqrt(len(rounded)))
    return math.erfc(z / math.sqrt(2))


UNBIASED_INPUTS = (1 + 2.0**-12 + 2.0**-14, 0.1, -3.3e-6, 300.3)


@check("formats.stochastic_unbiased")
def _() -> Observation:
    n, worst, count = 20_000, 1.0, 0
    for name in ("bfloat16", "float16", "float8_e4m3fn"):
        for i, v in enumerate(UNBIASED_INPUTS):
            x = np.full(n, v, dtype=np.float32)
            r = ref.quantize(x, name, rounding="stochastic", rng=np.random.default_rng(i))
            g = torch.Generator().manual_seed(i)
            t = tim.quantize(torch.from_numpy(x), name, rounding="stochastic", rng=g).numpy()
            worst = min(worst, stochastic_p_value(float(x[0]), name, r),
                        stochastic_p_value(float(x[0]), name, t))
            count += 2 * n
    return Observation(worst, count, "observed = smallest two-sided p-value")


@check("formats.sweep")
def _() -> Observation:
    total, bad = 0, 0
    for name in TORCH_DTYPE_FORMATS:
        s = sweep_sample(name, 1 << 20, seed=3)
        total += s.total
        bad += s.mismatches_torch + s.mismatches_ml_dtypes
    return Observation(float(bad), total, "2^20 random float32 bit patterns per format")


@picture("formats_spacing.png")
def spacing_picture(path: object) -> None:
    """Spacing of representable values against magnitude, log-log: full range and a zoom."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for name in ("float16", "bfloat16", "float8_e5m2", "float8_e4m3fn"):
        fmt = ref.FORMATS[name]
        codes = np.arange(fmt.max_code + 1).astype(fmt.code_dtype)
        values = ref.decode(codes, name)
        spacing = np.diff(values)
        for ax in axes:
            line, = ax.step(values[1:], spacing, where="post",
                            label=f"{name} (e{fmt.exponent_bits}m{fmt.mantissa_bits})")
            ax.axvline(fmt.tiny, color=line.get_color(), linestyle=":", linewidth=0.8)
    for ax, title in zip(axes, ("whole range", "zoom: the fp16 and fp8 ranges"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("magnitude |x|  (dotted: tiny, the smallest normal)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("spacing to the next representable value")
    axes[1].set_xlim(2.0**-26, 2.0**17)
    axes[1].set_ylim(2.0**-26, 2.0**14)
    axes[1].legend(loc="upper left")
    fig.suptitle("Spacing is flat across the subnormals and proportional to |x| above tiny")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
