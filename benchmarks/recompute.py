"""Checkpointing's trade: held bytes and forward+backward time relative to no checkpointing.

    python benchmarks/recompute.py [--repeats 21] [--width 256] [--write]

Chains of 17, 33 and 65 modules (Linear(256, 256) + Tanh pairs, then a Linear; float32,
batch 64), seven schedules, both implementations (the reference with track_peak=False: its
peak-bytes sampling walks the tape after every step, bookkeeping, not training).

Timing: CPU time of this process (time.process_time) for one forward + backward, on ONE
thread (torch.set_num_threads(1); OPENBLAS/MKL/OMP_NUM_THREADS=1 for NumPy's BLAS, set
before NumPy loads). CPU time counts this process only, so other jobs on a shared machine
count less than in wall time (they still contend for caches and memory bandwidth). One
warm-up round, then `repeats` rounds; in each round every (chain, implementation, schedule)
runs once, in an order shuffled per round, so drifts hit every point alike. Each point's
time ratio is taken within a round (schedule / "none" of the same chain and implementation)
and summarized over rounds by the median, quartiles and min-max. Next to it: R / n
(recomputed layer forwards over n) and the time it predicts, 1 + R / (3n), if a layer's
backward costs two of its forwards.

--write saves docs/data/recompute_benchmark.json and redraws docs/img/recompute_tradeoff.png;
`python -m parity docs` regenerates the figures in docs/recompute.md from that file.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy loads its BLAS: one thread, as torch below

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from parity.drivers.recompute import (  # noqa: E402
    BENCH_SPECS,
    BENCH_UNITS,
    chain,
    inputs,
    make_ref,
    make_twin,
    theory_time_ratio,
    tradeoff_rows,
)
from parity.lab.pictures import have_matplotlib  # noqa: E402
from parity.lab.pictures.recompute import BENCH_JSON, draw_tradeoff  # noqa: E402
from reference import recompute as rrc  # noqa: E402
from torch_impl import recompute as trc  # noqa: E402

METHOD = ("CPU time (time.process_time) of one forward+backward, 1 thread (torch and NumPy's "
          "BLAS), ratios to 'none' within each round")


def one_run(side: str, model: object, x: object, g: object, spec: str) -> float:
    """CPU seconds of one forward + backward under `spec`."""
    start = time.process_time()
    if side == "reference":
        rrc.forward_with_schedule(model, x, spec, track_peak=False).backward(g)  # type: ignore
    else:
        trc.forward_with_schedule(model, x, spec).backward(g)  # type: ignore[arg-type]
    return time.process_time() - start


def time_ratios(width: int, repeats: int, seed: int = 0) -> dict[tuple[int, str, str], list]:
    """(n, side, spec) -> per-round ratios time(spec) / time(none), rounds interleaved."""
    setups = {}
    for units in BENCH_UNITS:
        case = chain(units, width)
        x, g = inputs(case)
        n = len(make_ref(case))
        setups[(n, "reference")] = (make_ref(case), x, g)
        setups[(n, "torch")] = (make_twin(case), torch.from_numpy(x).requires_grad_(True),
                                torch.from_numpy(g))
    jobs = [(key, spec) for key in setups for spec in BENCH_SPECS]
    order = random.Random(seed)
    ratios: dict[tuple[int, str, str], list] = {(n, side, s): [] for (n, side), s in jobs}
    for round_ in range(repeats + 1):  # round 0 warms up and is dropped
        order.shuffle(jobs)
        seconds = {(key, spec): one_run(key[1], *setups[key], spec) for key, spec in jobs}
        if round_ == 0:
            continue
        for (n, side), spec in jobs:
            ratios[(n, side, spec)].append(seconds[((n, side), spec)]
                                           / seconds[((n, side), "none")])
        print(f"round {round_}/{repeats}", end="\r", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return ratios


def spread(values: list[float]) -> dict[str, float]:
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3),
            "min": float(min(values)), "max": float(max(values))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error(f"--repeats must be at least 3 (quartiles need repeats), got {args.repeats}")
    torch.set_num_threads(1)
    print(f"timing: {METHOD}; torch threads {torch.get_num_threads()}; "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; {args.repeats} rounds "
          f"after one warm-up, schedules shuffled within each round")
    ratios = time_ratios(args.width, args.repeats)
    rows = tradeoff_rows(BENCH_UNITS, args.width)
    for r in rows:
        for side in ("reference", "torch"):
            r[f"{side}_time_ratio"] = spread(ratios[(r["n"], side, r["spec"])])
    head = ("n", "schedule", "held", "torch held", "peak", "R/n", "theory", "ref median [IQR]",
            "torch median [IQR]")
    print("  ".join(f"{h:>20}" for h in head))
    for r in rows:
        cells = [f"{r['n']}", r["spec"], f"{r['held_ratio']:.3f}", f"{r['torch_held_ratio']:.3f}",
                 f"{r['peak_ratio']:.3f}", f"{r['recompute_fraction']:.3f}",
                 f"{theory_time_ratio(r['recompute_fraction']):.3f}"]
        for side in ("reference", "torch"):
            s = r[f"{side}_time_ratio"]
            cells.append(f"{s['median']:.2f} [{s['q1']:.2f}, {s['q3']:.2f}]")
        print("  ".join(f"{c:>20}" for c in cells))
    if args.write:
        bench = {"method": METHOD, "repeats": args.repeats, "width": args.width, "batch": 64,
                 "dtype": "float32", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                 "torch": torch.__version__, "numpy": np.__version__, "rows": rows}
        BENCH_JSON.parent.mkdir(parents=True, exist_ok=True)
        BENCH_JSON.write_text(json.dumps(bench, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {BENCH_JSON.relative_to(ROOT)}")
        if have_matplotlib():
            draw_tradeoff(ROOT / "docs" / "img" / "recompute_tradeoff.png")
            print("drew docs/img/recompute_tradeoff.png")
        print("run `python -m parity docs` for the figures in docs/recompute.md")


if __name__ == "__main__":
    main()
