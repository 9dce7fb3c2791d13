"""Running the number formats of both trees (and ml_dtypes) on the same inputs.

Each driver returns the arrays a formats claim compares; the exact oracles come from
parity/oracles.py. Inputs are built from the bit layout with exact Python arithmetic
(parity.oracles.member_value), never with the reference under test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

import reference.formats as ref
import torch_impl.formats as tim
from parity import oracles

# The committed measurement of benchmarks/formats.py (the picture and the table in
# docs/formats.md are drawn from it), and the ratios it is judged against: the reference's
# encode at least this fraction of torch's single-thread cast's speed at every size.
ENCODE_JSON = Path(__file__).resolve().parents[2] / "docs" / "data" / "formats_encode.json"
ENCODE_TARGETS = {"bfloat16": 0.1, "float16": 0.1, "float8_e5m2": 0.05, "float8_e4m3fn": 0.05}


def encode_benchmark() -> dict:
    """The committed encode benchmark (python benchmarks/formats.py writes it)."""
    return json.loads(ENCODE_JSON.read_text(encoding="utf-8"))


def as_torch(x: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """x as a tensor on `device`, 0-d kept 0-d (np.ascontiguousarray would make it 1-d)."""
    return torch.from_numpy(np.array(x, order="C")).to(device)


# ----------------------------------------------------------------------------- inputs
def edge_inputs(name: str, n_codes: int = 2048, seed: int = 0, n_random: int = 4096
                ) -> np.ndarray:
    """float32 members, ties, +-1 and +-2 float32 ulps around ties, specials, random bits."""
    fmt = ref.FORMATS[name]
    rng = np.random.default_rng(seed)
    top = fmt.max_code
    codes = np.arange(top + 1) if top < n_codes else rng.integers(0, top, n_codes)
    lo = np.array([oracles.member_value(fmt, int(c)) for c in codes])
    hi = np.array([oracles.member_value(fmt, int(c) + 1) if c < top else
                   fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits) for c in codes])
    with np.errstate(over="ignore"):  # float32's own ties lie beyond its range at the top
        ties = ((lo + hi) / 2).astype(np.float32)
        up = np.nextafter(ties, np.float32(np.inf))
        down = np.nextafter(ties, np.float32(-np.inf))
        near = [up, down, np.nextafter(up, np.float32(np.inf)),
                np.nextafter(down, np.float32(-np.inf))]
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fmt.tiny, fmt.smallest_subnormal,
                         fmt.smallest_subnormal / 2], dtype=np.float32)
    bits = rng.integers(0, 2**32, size=n_random, dtype=np.uint32).view(np.float32)
    x = np.concatenate([lo.astype(np.float32), ties, *near, specials, bits])
    return np.concatenate([x, -x])


def edge_inputs_float64(name: str, seed: int = 0, n_codes: int = 512, n_random: int = 4096
                        ) -> np.ndarray:
    """float64 ties moved by a few float64 ulps (double-rounding cases), and random doubles."""
    with np.errstate(invalid="ignore"):  # signalling NaNs are quieted on widening
        x32 = edge_inputs(name, n_codes, seed, n_random).astype(np.float64)
    rng = np.random.default_rng(seed)
    finite = x32[np.isfinite(x32) & (x32 != 0)]
    with np.errstate(over="ignore"):
        moved = finite + np.spacing(finite) * rng.integers(-3, 4, finite.size) * \
            2.0 ** rng.integers(0, 21, finite.size)
    doubles = rng.integers(0, 2**64, size=n_random // 2, dtype=np.uint64).view(np.float64)
    return np.concatenate([x32, moved, doubles])


# ----------------------------------------------------------------------------- ranges, decode
def ranges(name: str) -> dict[str, np.ndarray]:
    """Every range field (oracles.RANGE_FIELDS) as the reference, torch and, for storage
    formats, ml_dtypes give it."""
    fields = oracles.RANGE_FIELDS
    out = {side: np.array([float(getattr(lib.FORMATS[name], f)) for f in fields])
           for side, lib in (("reference", ref), ("torch", tim))}
    if name in oracles.ML_DTYPES:
        ml = oracles.ml_dtypes_ranges(name)
        out["ml_dtypes"] = np.array([ml[f] for f in fields])
    return out


def decode_every_code(name: str, device: str = "cpu") -> dict[str, np.ndarray]:
    """The float64 value of every code of an 8- or 16-bit storage format in each library."""
    codes = np.arange(2 ** ref.FORMATS[name].bits, dtype=ref.FORMATS[name].code_dtype)
    with np.errstate(invalid="ignore"):  # signalling NaN codes raise "invalid" when widened
        ml = codes.view(oracles.ML_DTYPES[name]).astype(np.float64)
    return {"reference": ref.decode(codes, name),
            "torch": tim.decode(as_torch(codes, device), name).cpu().numpy(),
            "ml_dtypes": ml}


# ----------------------------------------------------------------------------- rounding
def nearest_vs_torch(x: np.ndarray, name: str, device: str = "cpu"
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest codes of x, each decoded by its own side (formats.decode proves the
    decoders equal), so NaN codes compare as a class: (reference with torch's own overflow
    policy, torch's native cast)."""
    got = ref.decode(ref.encode(x, name, overflow=tim.DEFAULT_OVERFLOW[name]), name)
    return got, tim.decode(tim.encode(as_torch(x, device), name), name).cpu().numpy()


def nearest_vs_ml_dtypes(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(reference, ml_dtypes' astype): ml_dtypes gives NaN on float8_e4m3fn overflow."""
    overflow = "nan" if name == "float8_e4m3fn" else None
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf/NaN is the subject
        expected = x.astype(oracles.ML_DTYPES[name]).astype(np.float64)
    return ref.decode(ref.encode(x, name, overflow=overflow), name), expected


def correctly_rounded(x: np.ndarray, name: str, device: str = "cpu"
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 x rounded once: (reference, torch's round-to-odd construction, the Fraction
    oracle), with overflow to inf (IEEE) or saturating (fn)."""
    fmt = ref.FORMATS[name]
    overflow = "inf" if fmt.convention == "ieee" else "saturate"
    oracle = np.array([oracles.round_exact(v, fmt, overflow=overflow) for v in x.tolist()])
    got_torch = tim.quantize(as_torch(x, device), name, overflow=overflow).cpu().numpy()
    return ref.quantize(x, name, overflow=overflow), got_torch, oracle


def via_float32_vs_torch(x: np.ndarray, name: str, device: str = "cpu"
                         ) -> tuple[np.ndarray, np.ndarray]:
    """float64 x rounded through float32: (reference via="float32", torch's native cast)."""
    native = as_torch(x, device).to(tim.FORMATS[name].dtype).to(torch.float64).cpu().numpy()
    got = ref.quantize(x, name, via="float32", overflow=tim.DEFAULT_OVERFLOW[name])
    return got, native


def toward_zero(x: np.ndarray, name: str, overflow: str | None, device: str = "cpu"
                ) -> tuple[np.ndarray, np.ndarray]:
    """(reference, torch) rounding toward zero under one overflow policy (None: default)."""
    got = ref.quantize(x, name, rounding="toward_zero", overflow=overflow)
    expected = tim.quantize(as_torch(x, device), name, rounding="toward_zero", overflow=overflow)
    return got, expected.cpu().numpy()


def stochastic_same_words(x: np.ndarray, name: str, words: np.ndarray, overflow: str,
                          device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """(reference, torch) stochastic rounding of x with the same uint32 words."""
    got = ref.quantize(x, name, rounding="stochastic", random_bits=words, overflow=overflow)
    expected = tim.quantize(as_torch(x, device), name, rounding="stochastic",
                            random_bits=as_torch(words.astype(np.int64), device),
                            overflow=overflow)
    return got, expected.cpu().numpy()


# ----------------------------------------------------------------------------- stochastic counts
def stochastic_domain(x: np.ndarray, name: str) -> np.ndarray:
    """The x for which stochastic rounding chooses between two neighbours: finite, and below
    max plus one spacing (beyond that even rounding toward zero overflows)."""
    fmt = ref.FORMATS[name]
    with np.errstate(invalid="ignore"):  # (NaN compares False: dropped)
        keep = np.abs(x.astype(np.float64)) < fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits)
    return x[keep]


def _stochastic(side: str, name: str, device: str) -> Callable[[np.ndarray, np.ndarray],
                                                                np.ndarray]:
    """q(x, words): `side`'s stochastic rounding, overflowing to inf (IEEE) or NaN (fn) so that
    rounding up past max is visible."""
    policy = "nan" if ref.FORMATS[name].convention == "fn" else "inf"
    if side == "reference":
        return lambda x, words: ref.quantize(x, name, rounding="stochastic", random_bits=words,
                                             overflow=policy)

    def q(x: np.ndarray, words: np.ndarray) -> np.ndarray:
        return tim.quantize(as_torch(x, device), name, rounding="stochastic", overflow=policy,
                            random_bits=as_torch(words.astype(np.int64), device)).cpu().numpy()
    return q


def words_rounding_up(x: np.ndarray, name: str, side: str, device: str = "cpu",
                      probes: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """For each finite x (|x| below max plus one spacing), how many 32-bit words make `side`
    ("reference" or "torch") round x up, and whether that count is confirmed.

    Both trees round up exactly when the word is below a threshold t (NOTE [ Stochastic
    rounding with 32-bit words ]), so the words that round up are [0, t) and their count
    is t. t is found by bisection over the words (33 roundings of the whole array), then
    confirmed: up at t - 1, not up at t, and up exactly below t at `probes` random words per
    element. Returns (t as int64, confirmed as bool)."""
    stochastic = _stochastic(side, name, device)
    low = ref.quantize(x, name, rounding="toward_zero") if side == "reference" else \
        tim.quantize(as_torch(x, device), name, rounding="toward_zero").cpu().numpy()

    def up(x: np.ndarray, words: np.ndarray) -> np.ndarray:  # away from zero (NaN: overflow)
        return ~(stochastic(x, words) == low)

    lo = np.zeros(x.shape, dtype=np.int64)
    hi = np.full(x.shape, 2**32, dtype=np.int64)
    while np.any(lo < hi):  # invariant: words below lo round up, words from hi do not
        mid = (lo + hi) // 2
        going_up = up(x, np.minimum(mid, 2**32 - 1).astype(np.uint32)) & (lo < hi)
        lo = np.where(going_up, mid + 1, lo)
        hi = np.where(~going_up & (lo < hi), mid, hi)
    t = lo
    confirmed = ~up(x, np.minimum(t, 2**32 - 1).astype(np.uint32)) | (t == 2**32)
    confirmed &= up(x, np.maximum(t - 1, 0).astype(np.uint32)) | (t == 0)
    rng = np.random.default_rng(seed)
    for _ in range(probes):
        u = rng.integers(0, 2**32, size=x.shape, dtype=np.uint32)
        confirmed &= up(x, u) == (u.astype(np.int64) < t)
    return t, confirmed


def oracle_words_rounding_up(x: np.ndarray, name: str) -> np.ndarray:
    """floor(2^32 p) for each x, exactly (parity.oracles.words_rounding_up)."""
    fmt = ref.FORMATS[name]
    return np.array([oracles.words_rounding_up(v, fmt) for v in x.tolist()], dtype=np.int64)


# ----------------------------------------------------------------------------- one contract
@dataclass(frozen=True)
class Side:
    """One tree, with the array constructors its functions take."""

    lib: ModuleType
    device: str = "cpu"

    @property
    def is_torch(self) -> bool:
        return self.lib is tim

    def array(self, values: object, dtype: str = "float32") -> object:
        a = np.array(values, dtype=dtype)
        return as_torch(a, self.device) if self.is_torch else a

    def dtype(self, name: str) -> object:
        return getattr(torch, name) if self.is_torch else np.dtype(name)

    def generator(self) -> object:
        return torch.Generator(self.device).manual_seed(0) if self.is_torch else \
            np.random.default_rng(0)

    def foreign_generator(self) -> object:
        """The other library's generator: a type error here."""
        return np.random.default_rng(0) if self.is_torch else torch.Generator().manual_seed(0)


Case = tuple[str, str, Callable[[Side], object]]  # (label, expected outcome, call)


def _rounding_calls(fn: str) -> tuple[Case, ...]:
    """Bad arguments of encode/quantize (`fn`), each alone, with the error each must raise."""
    def call(s: Side, x: object = None, fmt: str = "float16", **kw: object) -> object:
        return getattr(s.lib, fn)(s.array([1.5]) if x is None else x, fmt, **kw)

    def words(s: Side, values: list[int]) -> object:
        return s.array(values, "int64")

    return tuple((f"{fn}: {label}", error, case) for label, error, case in (
        ("unknown format", "ValueError", lambda s: call(s, fmt="float12")),
        ("integer input", "TypeError", lambda s: call(s, s.array([1, 2], "int64"))),
        ("float16 input", "TypeError", lambda s: call(s, s.array([1.0], "float16"))),
        ("unknown rounding", "ValueError", lambda s: call(s, rounding="up")),
        ("stochastic without words", "ValueError", lambda s: call(s, rounding="stochastic")),
        ("stochastic with rng and random_bits", "ValueError", lambda s: call(
            s, rounding="stochastic", rng=s.generator(), random_bits=words(s, [0]))),
        ("rng of the other library", "TypeError", lambda s: call(
            s, rounding="stochastic", rng=s.foreign_generator())),
        ("float random_bits", "TypeError", lambda s: call(
            s, rounding="stochastic", random_bits=s.array([0.5]))),
        ("random_bits of another shape", "ValueError", lambda s: call(
            s, rounding="stochastic", random_bits=words(s, [0, 1]))),
        ("negative random_bits", "ValueError", lambda s: call(
            s, rounding="stochastic", random_bits=words(s, [-1]))),
        ("random_bits of 2^32", "ValueError", lambda s: call(
            s, rounding="stochastic", random_bits=words(s, [2**32]))),
        ("rng with nearest rounding", "ValueError", lambda s: call(s, rng=s.generator())),
        ("random_bits with toward_zero", "ValueError", lambda s: call(
            s, rounding="toward_zero", random_bits=words(s, [0]))),
        ("unknown overflow", "ValueError", lambda s: call(s, overflow="wrap")),
        ("overflow=inf without infinity", "ValueError", lambda s: call(
            s, fmt="float8_e4m3fn", overflow="inf")),
        ("via on float32 input", "ValueError", lambda s: call(s, via="float32")),
        ("unknown via", "ValueError", lambda s: call(s, s.array([1.5], "float64"),
                                                     via="float16")),
    ))


BAD_INPUTS: tuple[Case, ...] = (
    *_rounding_calls("encode"),
    *_rounding_calls("quantize"),
    ("decode: float codes", "TypeError",
     lambda s: s.lib.decode(s.array([1.0]), "float16")),
    ("decode: bool codes", "TypeError",
     lambda s: s.lib.decode(s.array([True], "bool"), "float16")),
    ("decode: code 2^16 of float16", "ValueError",
     lambda s: s.lib.decode(s.array([2**16], "int64"), "float16")),
    ("decode: code 2^8 of float8", "ValueError",
     lambda s: s.lib.decode(s.array([256], "int64"), "float8_e5m2")),
    ("decode: code 2^19 of tf32", "ValueError",
     lambda s: s.lib.decode(s.array([2**19], "int64"), "tf32")),
    ("decode: negative code", "ValueError",
     lambda s: s.lib.decode(s.array([-1], "int64"), "bfloat16")),
    ("decode: to float16", "TypeError",
     lambda s: s.lib.decode(s.array([0], "uint8"), "float8_e4m3fn", dtype=s.dtype("float16"))),
    ("decode: unknown format", "ValueError",
     lambda s: s.lib.decode(s.array([0], "uint16"), "float12")),
)


def _good_calls(shape: tuple[int, ...]) -> tuple[Case, ...]:
    """Good calls on inputs of one shape, with the shape and dtype each must return."""
    n = int(np.prod(shape))
    x32 = np.linspace(-3, 3, n, dtype=np.float32).reshape(shape)
    words = np.arange(n, dtype=np.int64).reshape(shape) * 0x9E3779B1 % 2**32

    def stochastic(s: Side, **kw: object) -> object:
        return s.lib.quantize(s.array(x32), "bfloat16", rounding="stochastic", **kw)

    return tuple((f"{label} {shape}", f"{shape} {dtype}", case) for label, dtype, case in (
        ("encode bfloat16", "uint16", lambda s: s.lib.encode(s.array(x32), "bfloat16")),
        ("encode tf32", "uint32", lambda s: s.lib.encode(s.array(x32), "tf32")),
        ("encode float8_e4m3fn", "uint8",
         lambda s: s.lib.encode(s.array(x32, "float64"), "float8_e4m3fn")),
        ("quantize float32", "float32", lambda s: s.lib.quantize(s.array(x32), "float16")),
        ("quantize float64", "float64",
         lambda s: s.lib.quantize(s.array(x32, "float64"), "float16")),
        ("quantize toward_zero", "float32",
         lambda s: s.lib.quantize(s.array(x32), "float8_e5m2", rounding="toward_zero")),
        ("quantize stochastic, rng", "float32", lambda s: stochastic(s, rng=s.generator())),
        ("quantize stochastic, words", "float32",
         lambda s: stochastic(s, random_bits=s.array(words, "int64"))),
        ("quantize via float32", "float64",
         lambda s: s.lib.quantize(s.array(x32, "float64"), "float16", via="float32")),
        ("decode uint16 codes", "float64",
         lambda s: s.lib.decode(s.array(words % 2**16, "uint16"), "float16")),
        ("decode int64 codes", "float64",
         lambda s: s.lib.decode(s.array(words % 2**16, "int64"), "bfloat16")),
        ("decode to float32", "float32", lambda s: s.lib.decode(
            s.array(words % 256, "uint8"), "float8_e4m3fn", dtype=s.dtype("float32"))),
    ))


GOOD_SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (5,), (2, 3, 4))


def outcome(side: Side, case: Callable[[Side], object]) -> str:
    """What a call gives: the error class it raises, or the shape and dtype it returns."""
    try:
        result = case(side)
    except Exception as e:  # the class is the contract; the message is each side's own
        return type(e).__name__
    dtype = str(result.dtype).removeprefix("torch.")  # type: ignore[attr-defined]
    return f"{tuple(result.shape)} {dtype}"  # type: ignore[attr-defined]


def contract(device: str = "cpu") -> list[tuple[str, str, str, str]]:
    """(case, expected, reference outcome, torch outcome) for every bad input and good call."""
    sides = Side(ref), Side(tim, device)
    cases = [*BAD_INPUTS, *(c for shape in GOOD_SHAPES for c in _good_calls(shape))]
    return [(label, expected, outcome(sides[0], case), outcome(sides[1], case))
            for label, expected, case in cases]
