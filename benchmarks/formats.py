"""Encode throughput: reference.formats.encode against torch's native cast, per array size.

    python benchmarks/formats.py [--repeats 9] [--clock thread|wall] [--no-write]

Random float32 bit patterns (NaNs, infinities and subnormals included, as in a sweep), at
every size 2^10 .. 2^24, for bfloat16, float16 and both float8 formats: the reference's
encode and torch's `Tensor.to(dtype)` on one thread (torch.set_num_threads(1)). One repeat
times every (size, format) pair, the two sides back to back, so a ratio is measured side by
side; sizes and formats are interleaved, and the median and interquartile range (IQR) over
repeats are reported. Each timing covers at least 2^19 elements (many calls on small
arrays). The clock
is the thread's CPU time by default (time.thread_time: on a machine whose cores are shared,
time spent descheduled is not counted) or wall time (--clock wall).

Targets: the reference at >= 0.1x torch's speed for bfloat16 and float16 (>= 0.05x for the
float8 formats) at every size, and, from 2^14 up, no size more than 1.5x slower per element
than the best size. Writes docs/data/formats_encode.json (the picture and the table in
docs/formats.md are drawn from it: python -m parity docs).

torch is imported before timing, as everywhere in this project (NOTE [ Encoding in blocks ]
in reference/encode_kernels.py says why the allocator's state matters).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import reference.formats as ref  # noqa: E402
from parity.drivers.formats import ENCODE_JSON, ENCODE_TARGETS  # noqa: E402

SIZES = tuple(range(10, 25))  # log2 of the element count
NAMES = ("bfloat16", "float16", "float8_e5m2", "float8_e4m3fn")


def seconds_per_call(fn: object, n: int, clock: object) -> float:
    """The time of one call, from calls covering 2^19 elements (at least one call; one
    warm-up call first)."""
    fn()  # type: ignore[operator]
    calls = max(1, 2**19 // n)
    start = clock()  # type: ignore[operator]
    for _ in range(calls):
        fn()  # type: ignore[operator]
    return (clock() - start) / calls  # type: ignore[operator]


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else the platform's machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def quartiles(values: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def measure(repeats: int, clock_name: str) -> dict:
    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    load_at_start = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=2 ** max(SIZES), dtype=np.uint32)
    samples: dict[tuple[str, int], dict[str, list[float]]] = {
        (name, k): {"reference": [], "torch": [], "ratio": []} for name in NAMES for k in SIZES}
    for r in range(repeats):
        for k in SIZES:
            x = bits[: 2**k].view(np.float32).copy()
            xt = torch.from_numpy(x)
            for name in NAMES:
                dtype = getattr(torch, name)
                t_ref = seconds_per_call(lambda x=x, name=name: ref.encode(x, name), 2**k, clock)
                t_torch = seconds_per_call(lambda xt=xt, d=dtype: xt.to(d), 2**k, clock)
                s = samples[(name, k)]
                s["reference"].append(t_ref / 2**k * 1e9)
                s["torch"].append(t_torch / 2**k * 1e9)
                s["ratio"].append(t_torch / t_ref)
        print(f"repeat {r + 1}/{repeats} done", file=sys.stderr)
    rows = [{"format": name, "log2_size": k,
             **{f"{side}_ns": quartiles(samples[(name, k)][side])
                for side in ("reference", "torch")},
             "ratio": quartiles(samples[(name, k)]["ratio"])}
            for name in NAMES for k in SIZES]
    return {
        "what": "reference.formats.encode vs torch Tensor.to(dtype), random float32 bit "
                "patterns, ns per element and torch time / reference time",
        "clock": "thread CPU time (time.thread_time)" if clock_name == "thread" else
                 "wall time (time.perf_counter)",
        "threads": "1 (torch.set_num_threads(1); NumPy single-threaded)",
        "repeats": repeats,
        "spread": "median and interquartile range over repeats; sizes and formats interleaved",
        "machine": f"{cpu_model()}, {os.cpu_count()} logical CPUs, 1-minute load average "
                   f"{load_at_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end",
        "versions": f"numpy {np.__version__}, torch {torch.__version__}",
        "rows": rows,
    }


def verdicts(result: dict) -> list[str]:
    """The targets, judged on the medians."""
    lines = []
    for name in NAMES:
        rows = [r for r in result["rows"] if r["format"] == name]
        least = min(rows, key=lambda r: r["ratio"]["median"])
        floor = ENCODE_TARGETS[name]
        per_elem = {r["log2_size"]: r["reference_ns"]["median"] for r in rows
                    if r["log2_size"] >= 14}
        spread = max(per_elem.values()) / min(per_elem.values())
        lines.append(
            f"{name}: smallest ratio {least['ratio']['median']:.3f} at 2^{least['log2_size']} "
            f"(target >= {floor}: {'met' if least['ratio']['median'] >= floor else 'NOT met'}); "
            f"from 2^14 up the slowest size is {spread:.2f}x the best per element "
            f"(target <= 1.5: {'met' if spread <= 1.5 else 'NOT met'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the spread needs two samples)")
    torch.set_num_threads(1)
    result = measure(args.repeats, args.clock)
    print(f"clock: {result['clock']}; threads: {result['threads']}; "
          f"{result['repeats']} repeats, {result['spread']}")
    print(f"{'format':<15}{'size':>6}{'reference ns':>24}{'torch ns':>24}{'torch/ref':>24}")
    for r in result["rows"]:
        cells = [f"{q['median']:.3f} [{q['q1']:.3f}, {q['q3']:.3f}]"
                 for q in (r["reference_ns"], r["torch_ns"], r["ratio"])]
        print(f"{r['format']:<15}{'2^' + str(r['log2_size']):>6}"
              + "".join(f"{c:>24}" for c in cells))
    for line in verdicts(result):
        print(line)
    if not args.no_write:
        ENCODE_JSON.parent.mkdir(parents=True, exist_ok=True)
        ENCODE_JSON.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {ENCODE_JSON.relative_to(ROOT)}; python -m parity docs redraws the "
              "picture and the table")


if __name__ == "__main__":
    main()
