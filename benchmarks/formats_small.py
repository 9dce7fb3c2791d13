"""Encode time of the small formats: the torch twin, the reference and ml_dtypes, per input.

    python benchmarks/formats_small.py [--repeats 9] [--no-write]

What an exhaustive sweep (parity/sweep.py) runs per chunk, on the chunks it runs: 2^16
consecutive float32 bit patterns, from random starting points (NaNs, infinities and
subnormals among them where the range has them). One repeat times, for every format and on
the same CHUNKS chunks, torch_impl.formats.encode (torch's cast for float8_e4m3fnuz,
e5m2fnuz and e8m0fnu, its cast to a sibling format for four more, exact torch ops for
float8_e3m4 and float4_e2m1fn), reference.formats.encode and
ml_dtypes' cast (`astype`), back to back, one thread each (torch.set_num_threads(1)), on the
thread's CPU clock (time.thread_time: on shared cores, time spent descheduled is not
counted). Formats are interleaved within a repeat; the median and interquartile range over
repeats are reported, in ns per input, with the ratios twin / reference and twin /
ml_dtypes, and the twin's share of an exhaustive sweep: 2^32 inputs on 2 cores.

Target: the twin's share of a sweep of an 8-bit-or-smaller format at most TWIN_TARGET_S
seconds on 2 idle cores. Writes docs/data/formats_small_encode.json (docs/formats.md's table
is drawn from it: python -m parity docs).
"""

from __future__ import annotations

import argparse
import json
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
import torch_impl.formats as tim  # noqa: E402
from benchmarks.formats import cpu_model  # noqa: E402  (the one reading of the CPU's name)
from parity.oracles import ML_DTYPES, SMALL_FORMATS  # noqa: E402

JSON = ROOT / "docs" / "data" / "formats_small_encode.json"
CHUNK = 1 << 16  # parity/sweep.py's chunk
CHUNKS = 8  # per timing
TWIN_TARGET_S = 15.0


def ns_per_input(fn: object, chunks: list[np.ndarray]) -> float:
    """Thread CPU time of fn over the chunks, per input (one warm-up call first)."""
    fn(chunks[0])  # type: ignore[operator]
    start = time.thread_time()
    for c in chunks:
        fn(c)  # type: ignore[operator]
    return (time.thread_time() - start) / (len(chunks) * CHUNK) * 1e9


def quartiles(values: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def run(repeats: int, seed: int = 0) -> dict:
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"twin": [], "reference": [], "ml_dtypes": []} for name in SMALL_FORMATS}
    for _ in range(repeats):
        starts = rng.integers(0, 2**32 // CHUNK, size=CHUNKS) * CHUNK
        chunks = [(np.arange(CHUNK, dtype=np.uint32) + np.uint32(s)).view(np.float32)
                  for s in starts]
        for name in SMALL_FORMATS:
            s = samples[name]
            s["twin"].append(ns_per_input(lambda x, n=name: tim.encode(torch.from_numpy(x), n),
                                          chunks))
            s["reference"].append(ns_per_input(lambda x, n=name: ref.encode(x, n), chunks))
            with np.errstate(over="ignore", invalid="ignore"):
                s["ml_dtypes"].append(ns_per_input(lambda x, n=name: x.astype(ML_DTYPES[n]),
                                                   chunks))
    rows = []
    for name, s in samples.items():
        twin = quartiles(s["twin"])
        rows.append({
            "format": name, "twin_ns": twin, "reference_ns": quartiles(s["reference"]),
            "ml_dtypes_ns": quartiles(s["ml_dtypes"]),
            "twin_over_reference": quartiles([a / b for a, b in zip(s["twin"], s["reference"],
                                                                    strict=True)]),
            "twin_over_ml_dtypes": quartiles([a / b for a, b in zip(s["twin"], s["ml_dtypes"],
                                                                    strict=True)]),
            "twin_sweep_s_2_cores": twin["median"] * 2**32 / 2 / 1e9,
        })
    return {"what": f"{CHUNKS} chunks of {CHUNK} consecutive float32 patterns per timing",
            "clock": "thread CPU time", "threads": 1, "repeats": repeats,
            "machine": f"{cpu_model()}, {platform.system()}",
            "versions": f"torch {torch.__version__}, numpy {np.__version__}, ml_dtypes "
                        f"{__import__('ml_dtypes').__version__}",
            "twin_target_s": TWIN_TARGET_S, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    out = run(args.repeats)
    print(f"{'format':20s} {'twin ns':>8s} {'ref ns':>8s} {'ml ns':>7s} {'twin/ref':>9s} "
          f"{'twin/ml':>8s} {'twin s/2^32 (2 cores)':>22s}")
    for r in out["rows"]:
        print(f"{r['format']:20s} {r['twin_ns']['median']:8.2f} {r['reference_ns']['median']:8.2f} "
              f"{r['ml_dtypes_ns']['median']:7.2f} {r['twin_over_reference']['median']:9.3f} "
              f"{r['twin_over_ml_dtypes']['median']:8.3f} {r['twin_sweep_s_2_cores']:22.1f}")
    if not args.no_write:
        JSON.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {JSON}")


if __name__ == "__main__":
    main()
