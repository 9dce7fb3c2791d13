"""`python -m parity sweep FORMAT`: reference vs torch vs ml_dtypes over float32 inputs.

The inputs are bit patterns: all 2^32 with --exhaustive, or a random sample. Work is cut
into chunks of 2^15 inputs (128 KiB of float32: the arrays of one chunk stay in cache) and
spread over worker processes. A mismatch is any pair of codes that differ, NaN counting as
one class; the declared policies are applied before comparing: torch with its own overflow
policy (DEFAULT_OVERFLOW of torch_impl.formats) and ml_dtypes with overflow="nan" for
float8_e4m3fn (ml_dtypes never saturates).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context

import numpy as np
from tqdm import tqdm

import reference.formats as ref
from parity.oracles import ML_DTYPES, STORAGE_FORMATS

CHUNK = 1 << 15
CLASSES = ("normal", "subnormal", "zero", "overflow", "inf", "nan")


@dataclass
class Summary:
    """Counts by input class, and mismatches against torch and against ml_dtypes."""

    name: str
    total: int = 0
    by_class: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    mismatches_torch: int = 0
    mismatches_ml_dtypes: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, other: Summary) -> None:
        self.total += other.total
        for k, v in other.by_class.items():
            self.by_class[k] += v
        self.mismatches_torch += other.mismatches_torch
        self.mismatches_ml_dtypes += other.mismatches_ml_dtypes
        self.examples = (self.examples + other.examples)[:10]


def _nan_codes(codes: np.ndarray, fmt: ref.FloatFormat) -> np.ndarray:
    magnitude = codes & codes.dtype.type(2 ** (fmt.bits - 1) - 1)
    if fmt.convention == "fn":
        return magnitude == fmt.nan_code
    return magnitude > fmt.inf_code


def _differ(a: np.ndarray, b: np.ndarray, fmt: ref.FloatFormat) -> np.ndarray:
    nan_a, nan_b = _nan_codes(a, fmt), _nan_codes(b, fmt)
    return np.where(nan_a | nan_b, nan_a != nan_b, a != b)


def sweep_bits(name: str, bits: np.ndarray) -> Summary:
    """Compare the three libraries on these float32 bit patterns (uint32)."""
    import torch

    import torch_impl.formats as tim

    fmt = ref.FORMATS[name]
    x = bits.view(np.float32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    is_nan = magnitude > np.uint32(0x7F800000)
    is_inf = magnitude == np.uint32(0x7F800000)
    # One reference rounding with the non-saturating policy shows where results overflow;
    # a saturating policy's codes then follow by replacing those (sign kept).
    unbounded = ref.encode(x, name, overflow="nan" if fmt.convention == "fn" else "inf")
    code_mag = unbounded & fmt.code_dtype(2 ** (fmt.bits - 1) - 1)
    beyond = ~is_nan & (code_mag == (fmt.nan_code if fmt.convention == "fn" else fmt.inf_code))

    def with_policy(policy: str) -> np.ndarray:
        if policy != "saturate":
            return unbounded
        return np.where(beyond, (unbounded & fmt.code_dtype(2 ** (fmt.bits - 1))) | fmt.max_code,
                        unbounded).astype(fmt.code_dtype)

    got = with_policy(tim.DEFAULT_OVERFLOW[name])
    native = torch.from_numpy(x).to(tim.FORMATS[name].dtype).view(tim.FORMATS[name].code_dtype)
    bad_torch = _differ(got, native.numpy().view(fmt.code_dtype), fmt)
    got_ml = with_policy("nan" if fmt.convention == "fn" else "inf")  # ml_dtypes never saturates
    with np.errstate(over="ignore", invalid="ignore"):
        ml = x.astype(ML_DTYPES[name]).view(fmt.code_dtype)
    bad_ml = _differ(got_ml, ml, fmt)

    s = Summary(name, total=bits.size)
    overflow = beyond & ~is_inf
    finite = ~is_nan & ~beyond
    s.by_class["nan"] = int(is_nan.sum())
    s.by_class["inf"] = int(is_inf.sum())
    s.by_class["overflow"] = int(overflow.sum())
    s.by_class["zero"] = int((finite & (code_mag == 0)).sum())
    subnormal = finite & (code_mag > 0) & (code_mag < 2**fmt.mantissa_bits)
    s.by_class["subnormal"] = int(subnormal.sum())
    s.by_class["normal"] = int((finite & (code_mag >= 2**fmt.mantissa_bits)).sum())
    s.mismatches_torch = int(bad_torch.sum())
    s.mismatches_ml_dtypes = int(bad_ml.sum())
    for i in np.flatnonzero(bad_torch | bad_ml)[:10]:
        s.examples.append(f"input 0x{int(bits[i]):08x}: reference 0x{int(got[i]):x}, "
                          f"torch 0x{int(native[i]):x}, ml_dtypes 0x{int(ml[i]):x}")
    return s


def _sweep_span(name: str, start: int, stop: int) -> Summary:
    import torch

    torch.set_num_threads(1)  # one core per worker process
    total = Summary(name)
    for lo in range(start, stop, CHUNK):
        bits = np.arange(lo, min(lo + CHUNK, stop), dtype=np.uint64).astype(np.uint32)
        total.add(sweep_bits(name, bits))
    return total


def _sample_span(name: str, seed: int, n: int) -> Summary:
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    total = Summary(name)
    for lo in range(0, n, CHUNK):
        bits = rng.integers(0, 2**32, size=min(CHUNK, n - lo), dtype=np.uint32)
        total.add(sweep_bits(name, bits))
    return total


def _run(name: str, tasks: list[tuple[Callable[..., Summary], tuple, int]], workers: int,
         progress: bool) -> Summary:
    if name not in STORAGE_FORMATS:
        raise ValueError(f"sweep formats: {', '.join(STORAGE_FORMATS)}; got {name!r}")
    total = Summary(name)
    with tqdm(total=sum(t[2] for t in tasks), desc=name, unit="input", unit_scale=True,
              file=sys.stderr, disable=not progress) as bar:
        if workers <= 1:
            for fn, args, size in tasks:
                total.add(fn(*args))
                bar.update(size)
        else:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(fn, *args): size for fn, args, size in tasks}
                for f in as_completed(futures):
                    total.add(f.result())
                    bar.update(futures[f])
    return total


def sweep_range(name: str, start: int, stop: int, workers: int = 2,
                progress: bool = False) -> Summary:
    """Every float32 bit pattern in [start, stop)."""
    step = 1 << 24
    tasks = [(_sweep_span, (name, lo, min(lo + step, stop)), min(lo + step, stop) - lo)
             for lo in range(start, stop, step)]
    return _run(name, tasks, workers, progress)


def sweep_sample(name: str, n: int, seed: int = 0, workers: int = 1,
                 progress: bool = False) -> Summary:
    """n random float32 bit patterns (independent streams per task)."""
    step = 1 << 22
    tasks = [(_sample_span, (name, seed * 100_003 + i, min(step, n - lo)), min(step, n - lo))
             for i, lo in enumerate(range(0, n, step))]
    return _run(name, tasks, workers, progress)


def render(s: Summary, seconds: float) -> str:
    lines = [f"{s.name}: {s.total:,} float32 inputs in {seconds:.1f} s"]
    for k in CLASSES:
        lines.append(f"  {k:<10} {s.by_class[k]:>14,}")
    lines.append(f"  mismatches vs torch    {s.mismatches_torch:,}")
    lines.append(f"  mismatches vs ml_dtypes {s.mismatches_ml_dtypes:,}")
    lines += [f"  {e}" for e in s.examples]
    return "\n".join(lines)
