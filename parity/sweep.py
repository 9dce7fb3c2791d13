"""`python -m parity sweep FORMAT`: reference vs torch vs ml_dtypes over float32 inputs.

The inputs are bit patterns: all 2^32 with --exhaustive, or a random sample. Work is cut
into chunks of CHUNK inputs and spread over worker processes (one thread each). A mismatch
is any pair of codes that differ, NaN counting as one class; the declared policies are
applied before comparing: torch with its own overflow policy (DEFAULT_OVERFLOW of
torch_impl.formats) and ml_dtypes with overflow="nan" for float8_e4m3fn (ml_dtypes never
saturates).

Per chunk: one reference encode (with the policy that keeps overflow visible; torch's
saturating policy follows from it), one torch cast (for the small formats, the torch twin's
encode, torch_impl/small_formats.py: torch's cast where torch has the dtype), one ml_dtypes
(or NumPy) cast, and a comparison that looks at NaN classes only where the codes differ. The
thread CPU time of the whole chunk and of the third library's cast within it are summed over
the chunks: the cast is the floor a sweep cannot go below, and timing it inside the sweep,
on the same chunks in the same processes, keeps the ratio fair on a machine whose load
changes without running the cast a second time (which would add its whole cost to the
sweep's wall time)."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import reference.formats as ref
from parity.oracles import ML_DTYPES, SWEEP_FORMATS
from parity.sweep_pool import end_workers, erased_bar, signals_blocked, worker_context, worker_start
from parity.sweep_small import range_classes, small_classes, small_nan_codes, torch_e8m0_codes

# 2^16 inputs: a chunk's ~40 NumPy and torch calls cost about 70 us fixed, about 1 ns per
# input; 2^18 would spread that, but measured interleaved with 2^16 in one process it took
# 1.6-1.8x the CPU time (its 1 MiB temporaries, allocated per chunk, fault fresh pages in).
CHUNK = 1 << 16
SWEEP_JSON = Path(__file__).resolve().parents[1] / "docs" / "data" / "formats_sweep.json"
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
    cpu_seconds: float = 0.0  # thread CPU time of sweep_bits, summed over workers
    oracle_cpu_seconds: float = 0.0  # of which the third library's cast

    def add(self, other: Summary) -> None:
        self.total += other.total
        self.cpu_seconds += other.cpu_seconds
        self.oracle_cpu_seconds += other.oracle_cpu_seconds
        for k, v in other.by_class.items():
            self.by_class[k] += v
        self.mismatches_torch += other.mismatches_torch
        self.mismatches_ml_dtypes += other.mismatches_ml_dtypes
        self.examples = (self.examples + other.examples)[:10]


def _nan_codes(codes: np.ndarray, fmt: ref.FloatFormat) -> np.ndarray:
    if fmt.convention not in ("ieee", "fn"):
        return small_nan_codes(codes, fmt)
    magnitude = codes & codes.dtype.type(2 ** (fmt.bits - 1) - 1)
    if fmt.convention == "fn":
        return magnitude == fmt.nan_code
    return magnitude > fmt.inf_code


def _mismatches(a: np.ndarray, b: np.ndarray, fmt: ref.FloatFormat,
                differ: np.ndarray) -> np.ndarray:
    """Indices where two code arrays differ, NaN counting as one class (NaN classes are
    looked at only where the codes differ: few places). `differ`: a bool array of a's size
    to work in."""
    np.not_equal(a, b, out=differ)
    if not differ.any():  # the usual case: skip the calls (a chunk's fixed cost is ~1 ns/input)
        return np.empty(0, dtype=np.intp)
    at = np.flatnonzero(differ)
    both_nan = _nan_codes(a[at], fmt) & _nan_codes(b[at], fmt)
    return at[~both_nan]


def _saturated(codes: np.ndarray, magnitude: np.ndarray, nan_in: np.ndarray,
               fmt: ref.FloatFormat, w: _Workspace) -> np.ndarray:
    """Codes of the non-saturating policy turned into the saturating one, in w.saturated:
    every overflow (not a NaN input) becomes +-max, sign kept. `magnitude` is the codes'
    without the sign. Integer arithmetic on the code's width: the excess over max,
    magnitude - min(magnitude, max), is subtracted, and NaN inputs' codes are put back."""
    excess = np.minimum(magnitude, w.max_code, out=w.excess)  # (against an array: fast)
    np.subtract(magnitude, excess, out=excess)
    out = np.subtract(codes, excess, out=w.saturated)
    np.copyto(out, codes, where=nan_in)
    return out


def _classes(magnitude: np.ndarray, x: np.ndarray, nan_in: np.ndarray,
             fmt: ref.FloatFormat, flag: np.ndarray) -> dict[str, int]:
    """Inputs by class: NaN and inf from the inputs `x`, the rest from the magnitudes of
    the reference's (non-saturating) codes. `flag`: a bool array of x's size to work in."""
    uint = magnitude.dtype.type

    def count(where: np.ndarray) -> int:
        return int(np.count_nonzero(where))

    zero = magnitude.size - count(magnitude)  # (counting nonzero codes needs no comparison)
    below_normal = count(np.less(magnitude, uint(2**fmt.mantissa_bits), out=flag))
    beyond = count(np.greater(magnitude, uint(fmt.max_code), out=flag))
    nan = count(nan_in)
    inf = count(np.isinf(x, out=flag))
    return {"normal": magnitude.size - below_normal - beyond, "subnormal": below_normal - zero,
            "zero": zero, "overflow": beyond - nan - inf, "inf": inf, "nan": nan}


class _Workspace:
    """One process's arrays for chunks of one size and format, reused by every chunk: the
    outputs of torch's and the third library's casts (`out.copy_(src)` and np.copyto run the
    same conversion as `src.to(dtype)` and `astype`), and the bookkeeping's. Allocating
    them per chunk faults fresh pages in (NOTE [ Encoding in blocks ] in
    reference/encode_kernels.py)."""

    def __init__(self, name: str, size: int) -> None:
        import torch

        import torch_impl.formats as tim

        fmt = ref.FORMATS[name]
        uint = fmt.code_dtype
        self.classic = not tim.FORMATS[name].small  # the small: parity/sweep_small.py
        self.torch_out = None
        if self.classic:
            self.torch_out = torch.empty(size, dtype=tim.FORMATS[name].dtype)
            self.torch_codes = self.torch_out.view(tim.FORMATS[name].code_dtype).numpy().view(uint)
        self.oracle_out = np.empty(size, dtype=ML_DTYPES[name])
        self.oracle_codes = self.oracle_out.view(uint)
        self.magnitude, self.excess, self.saturated = (np.empty(size, uint) for _ in range(3))
        self.max_code = np.full(size, fmt.max_code, dtype=uint)
        self.nan_in, self.flag = np.empty(size, bool), np.empty(size, bool)
        self.saturates = self.classic and tim.DEFAULT_OVERFLOW[name] == "saturate"

    @staticmethod
    @functools.cache
    def of(name: str, size: int) -> _Workspace:
        return _Workspace(name, size)


def sweep_bits(name: str, bits: np.ndarray, start: int | None = None) -> Summary:
    """Compare the three libraries on these float32 bit patterns (uint32); `start`: they
    are the consecutive patterns from start (an exhaustive sweep's chunk), whose classes a
    small format counts from the range alone (sweep_small.range_classes: on float4_e2m1fn
    the class passes and the NaN mask were 2 of the chunk's 16 ns an input)."""
    import torch

    import torch_impl.formats as tim

    began = time.thread_time()
    fmt = ref.FORMATS[name]
    w = _Workspace.of(name, bits.size)
    x = bits.view(np.float32)
    # classic: the policy that keeps overflow visible; the small formats: their default, the
    # libraries' (NOTE [ NaN to a finite format ], reference/small_formats.py)
    policy = ("nan" if fmt.convention == "fn" else "inf") if w.classic else None
    ours = ref.encode(x, name, overflow=policy)
    magnitude = np.bitwise_and(ours, ours.dtype.type(2 ** (fmt.bits - 1) - 1),
                               out=w.magnitude) if w.classic else None  # (the small: unused)
    nan_in = np.isnan(x, out=w.nan_in) if w.classic or start is None else None
    if w.torch_out is not None:
        w.torch_out.copy_(torch.from_numpy(x))
    else:  # the small formats: the torch twin (torch's own cast where it has one)
        w.torch_codes = tim.encode(torch.from_numpy(x), name).numpy()
    cast_began = time.thread_time()
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is the subject
        np.copyto(w.oracle_out, x, casting="unsafe")
    cast_seconds = time.thread_time() - cast_began
    if name == "float8_e8m0fnu":  # ml_dtypes' one declared difference: +-0 is NaN there
        w.oracle_codes[(bits & np.uint32(0x7FFFFFFF)) == 0] = 0  # (NOTE [ E8M0 at zero ])
    ours_torch = _saturated(ours, magnitude, nan_in, fmt, w) if w.saturates else ours
    if name == "float8_e8m0fnu" and name in tim.small.NATIVE:  # torch's declared difference
        # (claim formats.e8m0_torch; torch 2.6 has no such cast, the twin follows the reference)
        nonnegative = start is not None and start + bits.size <= 2**31
        ours_torch = torch_e8m0_codes(x, fmt, ours=ours if nonnegative else None)
    bad_torch = _mismatches(ours_torch, w.torch_codes, fmt, w.flag)
    bad_ml = _mismatches(ours, w.oracle_codes, fmt, w.flag)  # ml_dtypes never saturates
    if w.classic:
        classes = _classes(magnitude, x, nan_in, fmt, w.flag)
    elif start is not None:
        classes = range_classes(start, bits.size, fmt)
    else:
        classes = small_classes(x, nan_in, fmt)

    s = Summary(name, total=bits.size, by_class=classes,
                mismatches_torch=bad_torch.size, mismatches_ml_dtypes=bad_ml.size,
                oracle_cpu_seconds=cast_seconds)
    for i in np.union1d(bad_torch, bad_ml)[:10] if bad_torch.size or bad_ml.size else ():
        got_torch = hex(int(w.torch_codes[i]))
        s.examples.append(f"input 0x{int(bits[i]):08x}: reference 0x{int(ours_torch[i]):x} "
                          f"(0x{int(ours[i]):x} not saturating), torch {got_torch}, "
                          f"ml_dtypes 0x{int(w.oracle_codes[i]):x}")
    s.cpu_seconds = time.thread_time() - began
    return s


def _chunks(start: int, stop: int) -> Iterator[np.ndarray]:
    """The bit patterns [start, stop), chunk by chunk, each in the same array (a chunk is
    swept before the next is made; a fresh array per chunk measured 5% slower)."""
    base = np.arange(CHUNK, dtype=np.uint32)
    out = np.empty(CHUNK, dtype=np.uint32)
    for lo in range(start, stop, CHUNK):
        n = min(CHUNK, stop - lo)
        yield np.add(base[:n], np.uint32(lo), out=out[:n])


def _sweep_span(name: str, start: int, stop: int) -> Summary:
    import torch

    torch.set_num_threads(1)  # one core per worker process
    total = Summary(name)
    for lo, bits in zip(range(start, stop, CHUNK), _chunks(start, stop), strict=True):
        total.add(sweep_bits(name, bits, start=lo))
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
    if name not in SWEEP_FORMATS:
        raise ValueError(f"sweep formats: {', '.join(SWEEP_FORMATS)}; got {name!r}")
    total = Summary(name)
    bar = functools.partial(erased_bar, total=sum(t[2] for t in tasks), desc=name, unit="input",
                            unit_scale=True, file=sys.stderr, disable=not progress)
    if workers <= 1:
        with bar() as b:
            for fn, args, size in tasks:
                total.add(fn(*args))
                b.update(size)
        return total
    before = set(multiprocessing.active_children())
    with ProcessPoolExecutor(workers, mp_context=worker_context(),
                             initializer=worker_start) as pool:
        try:
            # The workers start at the first submit, before the bar starts its monitor thread.
            # The one other thread then is NumPy's OpenBLAS pool, idle, which shuts itself
            # down around a fork (its own fork handler): Python >= 3.12's warning does not apply.
            with warnings.catch_warnings(), signals_blocked():
                warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                        DeprecationWarning)
                futures = {pool.submit(fn, *args): size for fn, args, size in tasks}
            with bar() as b:
                for f in as_completed(futures):
                    total.add(f.result())
                    b.update(futures[f])
        except BaseException:
            end_workers(pool, set(multiprocessing.active_children()) - before)
            raise
    return total


def sweep_range(name: str, start: int, stop: int, workers: int = 2, progress: bool = False
                ) -> Summary:
    """Every float32 bit pattern in [start, stop), with the CPU time of the sweep and of the
    third library's cast within it (Summary.cpu_seconds, .oracle_cpu_seconds)."""
    step = 1 << 24
    tasks = [(_sweep_span, (name, lo, min(lo + step, stop)),
              min(lo + step, stop) - lo) for lo in range(start, stop, step)]
    return _run(name, tasks, workers, progress)


def sweep_sample(name: str, n: int, seed: int = 0, workers: int = 1,
                 progress: bool = False) -> Summary:
    """n random float32 bit patterns (independent streams per task)."""
    step = 1 << 22
    tasks = [(_sample_span, (name, seed * 100_003 + i, min(step, n - lo)), min(step, n - lo))
             for i, lo in enumerate(range(0, n, step))]
    return _run(name, tasks, workers, progress)


def record(s: Summary, seconds: float, workers: int, path: Path = SWEEP_JSON) -> None:
    """Store an exhaustive sweep's result under its format in docs/data/formats_sweep.json
    (the table in docs/formats.md is drawn from it: python -m parity docs)."""
    import platform

    import torch

    results = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    results[s.name] = {
        "inputs": s.total, "workers": workers, "wall_seconds": round(seconds, 1),
        "cpu_seconds_sweep": round(s.cpu_seconds, 1),
        "cpu_seconds_cast_alone": round(s.oracle_cpu_seconds, 1),
        "cast": ML_DTYPES[s.name].name, "mismatches_torch": s.mismatches_torch,
        "mismatches_ml_dtypes": s.mismatches_ml_dtypes, "by_class": s.by_class,
        "load_average_1min_at_end": round(os.getloadavg()[0], 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
        "versions": f"numpy {np.__version__}, torch {torch.__version__}",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n",
                    encoding="utf-8")


def render(s: Summary, seconds: float) -> str:
    lines = [f"{s.name}: {s.total:,} float32 inputs in {seconds:.1f} s (wall)"]
    for k in CLASSES:
        lines.append(f"  {k:<10} {s.by_class[k]:>14,}")
    lines.append(f"  mismatches vs torch    {s.mismatches_torch:,}")
    lines.append(f"  mismatches vs ml_dtypes {s.mismatches_ml_dtypes:,}")
    lines += [f"  {e}" for e in s.examples]
    if s.oracle_cpu_seconds:
        lines.append(f"  CPU time in the workers: sweep {s.cpu_seconds:.3g} s, of which the "
                     f"{ML_DTYPES[s.name].name} cast {s.oracle_cpu_seconds:.3g} s; "
                     f"sweep / cast = {s.cpu_seconds / s.oracle_cpu_seconds:.3g}")
    return "\n".join(lines)
