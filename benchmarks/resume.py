"""Cost of a safe checkpoint, each tree against its library's own plain save and load.

    python benchmarks/resume.py [--mib 1 64 512] [--repeats 7] [--dir DIR] [--write]
                                [--digests-only]

Save: `save_checkpoint` (stream through the hashing writer into a temporary file, fsync,
rename, fsync the directory) against the library's plain save into a file followed by the
same fsync: `torch.save(state, f)` for torch_impl, `numpy.save(f, a)` of every array for the
reference. Load: `load_checkpoint` (map, check lengths, decode while one helper thread
computes the XXH3-128, or below 16 MiB decode and then hash on one thread, compare) against
the plain load of that plain file: `torch.load(path, weights_only=True)`, and `numpy.load`
of every array (allow_pickle=False), each kept until all are loaded, as a loader keeps
them. Both files were just written, so both reads come from the page cache: the ratio is
the cost of the verification and decoding, not of the disk.

Method: wall time (time.perf_counter) and CPU time of every thread (time.process_time) of
each call, one thread for torch; the two sides of a ratio run alternately within each
repeat (interleaved), and the wall ratio is formed per repeat, so a slow moment of the
shared machine hits both sides. Reported: the median wall ratio and its min-max over the
repeats, and the ratio of the median CPU times (the work done, which other processes'
load does not inflate: on a saturated machine the digest's helper threads find no free
core, so wall time approaches the sum of the work), and the median count of minor page
faults (getrusage): whether a load's arrays land in memory malloc recycled or in fresh
pages (about 2 us a 4 KiB fault on this VM) swings either side by up to half at 64 MiB.
`--write` stores the result in docs/data/resume_io.json (docs/resume.md prints it through
`python -m parity docs`). Never asserted in tests.

Digests: the throughput of each candidate checksum over 1 MiB pieces, per core (the thread's
CPU time over 256 MiB) and with two threads (wall time): the standard library's SHA-256,
BLAKE2b and zlib's CRC-32, and XXH3-128 from the `xxhash` package (not the standard
library; the container's digest, NOTE [ Container digest ] in ckpt/digest.py). Against the
baselines' own throughput (their CPU time per byte in the rows above) it bounds what a
verified load or save can reach on this machine (docs/resume.md derives the bound).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference import resume as ref_resume  # noqa: E402
from torch_impl import resume as t_resume  # noqa: E402

TARGETS = {"save": 1.2, "load": 0.8}


def _arrays(mib: float) -> dict[str, np.ndarray]:
    n = int(mib * 2**20 / 4 / 3)  # params, exp_avg, exp_avg_sq: n float32 each
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal(n, dtype=np.float32),
            "exp_avg": rng.standard_normal(n, dtype=np.float32),
            "exp_avg_sq": rng.random(n, dtype=np.float32)}


def _state(arrays: dict[str, np.ndarray], tree: str) -> dict:
    conv = (lambda a: a) if tree == "reference" else (lambda a: torch.from_numpy(a))
    return {"model": {"w": conv(arrays["w"])},
            "optimizer": {"state": {0: {"exp_avg": conv(arrays["exp_avg"]),
                                        "exp_avg_sq": conv(arrays["exp_avg_sq"]),
                                        "step": conv(np.array(10.0, np.float32))}}},
            "step": 10}


def _plain_save(tree: str, state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        if tree == "torch":
            torch.save(state, f)
        else:
            for a in (state["model"]["w"], *state["optimizer"]["state"][0].values()):
                np.save(f, a, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _plain_load(tree: str, path: Path) -> object:
    """The library's own load of the plain file, returning everything it loaded: a loader
    keeps its arrays, and one that dropped each before reading the next would reuse one
    freed, already-mapped buffer for all of them and skip the page faults a real load pays
    (at 64 MiB about a third of numpy.load's time)."""
    if tree == "torch":
        return torch.load(path, weights_only=True, map_location="cpu")
    with open(path, "rb") as f:
        return [np.load(f, allow_pickle=False) for _ in range(4)]


def _time(fn: Callable[[], object]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of every thread of this process, minor page faults)."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - start, time.process_time() - cpu,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def measure(tree: str, mib: float, repeats: int, directory: Path) -> dict:
    """Interleaved timings of one tree at one size: per-repeat ratios, median and range."""
    mod = ref_resume if tree == "reference" else t_resume
    state = _state(_arrays(mib), tree)
    plain, safe = directory / "plain.bin", directory / "safe.ckpt"
    save_ratios, load_ratios = [], []
    times: dict[str, list[float]] = {"plain_save": [], "save": [], "plain_load": [], "load": []}
    cpus: dict[str, list[float]] = {k: [] for k in times}
    faults: dict[str, list[int]] = {k: [] for k in times}
    for i in range(repeats + 1):  # the first round warms the page cache and allocator
        order = [("plain_save", lambda: _plain_save(tree, state, plain)),
                 ("save", lambda: mod.save_checkpoint(safe, state))]
        loads = [("plain_load", lambda: _plain_load(tree, plain)),
                 ("load", lambda: mod.load_checkpoint(safe))]
        if i % 2:  # alternate which side goes first
            order.reverse()
            loads.reverse()
        measured = {name: _time(fn) for name, fn in order + loads}
        if i == 0:
            continue
        got = {name: wall for name, (wall, _, _) in measured.items()}
        for name, (wall, cpu, fault) in measured.items():
            times[name].append(wall)
            cpus[name].append(cpu)
            faults[name].append(fault)
        save_ratios.append(got["save"] / got["plain_save"])
        load_ratios.append(got["plain_load"] / got["load"])  # throughput ratio
    size = safe.stat().st_size / 2**20
    return {"tree": tree, "baseline": "torch.save/torch.load" if tree == "torch"
            else "numpy.save/numpy.load", "mib": round(size), "repeats": repeats,
            "save_ratio": statistics.median(save_ratios), "save_ratio_lo": min(save_ratios),
            "save_ratio_hi": max(save_ratios), "load_ratio": statistics.median(load_ratios),
            "load_ratio_lo": min(load_ratios), "load_ratio_hi": max(load_ratios),
            "median_ms": {k: round(statistics.median(v) * 1e3, 1) for k, v in times.items()},
            "median_cpu_ms": {k: round(statistics.median(v) * 1e3, 1) for k, v in cpus.items()},
            "median_faults": {k: round(statistics.median(v)) for k, v in faults.items()}}


DIGESTS: dict[str, Callable[[memoryview], object]] = {
    "sha256": lambda b: hashlib.sha256(b).digest(),
    "blake2b": lambda b: hashlib.blake2b(b).digest(),
    "crc32": zlib.crc32,
    "xxh3_128": xxhash.xxh3_128_digest,  # the `xxhash` package, not the standard library
}


def digest_throughput(repeats: int, mib: int = 256) -> dict[str, dict[str, float]]:
    """GiB/s of each digest over `mib` MiB in 1 MiB pieces: median and range over repeats of
    one thread's CPU time ("per_core") and of two threads' wall time ("two_threads")."""
    data = memoryview(np.random.default_rng(0).integers(0, 256, mib << 20, dtype=np.uint8))
    pieces = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    out = {}
    with ThreadPoolExecutor(2) as pool:
        for name, fn in DIGESTS.items():
            per_core, two = [], []
            for _ in range(repeats):  # the two ways alternate: a busy moment hits both
                start = time.thread_time()
                for piece in pieces:
                    fn(piece)
                per_core.append(mib / 1024 / (time.thread_time() - start))
                start = time.perf_counter()
                list(pool.map(fn, pieces))
                two.append(mib / 1024 / (time.perf_counter() - start))
            out[name] = {f"{way}_{stat}": round(f(values), 3)
                         for way, values in (("per_core", per_core), ("two_threads", two))
                         for stat, f in (("median", statistics.median), ("lo", min),
                                         ("hi", max))}
            print(f"{name:8s} per core {out[name]['per_core_median']:.2f} GiB/s "
                  f"[{out[name]['per_core_lo']:.2f}, {out[name]['per_core_hi']:.2f}], "
                  f"two threads {out[name]['two_threads_median']:.2f} GiB/s "
                  f"[{out[name]['two_threads_lo']:.2f}, {out[name]['two_threads_hi']:.2f}]",
                  flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[1, 64, 512])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trees", nargs="+", default=["torch", "reference"])
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--write", action="store_true", help="write docs/data/resume_io.json")
    parser.add_argument("--conditions", default="", help="a note on the machine's load")
    parser.add_argument("--digests-only", action="store_true",
                        help="measure the digests only; with --write, keep the stored rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    digests = digest_throughput(args.repeats)
    out = ROOT / "docs" / "data" / "resume_io.json"
    if args.digests_only:
        if args.write:
            data = json.loads(out.read_text(encoding="utf-8"))
            data["digests"] = digests
            data["digests_conditions"] = (
                f"{args.conditions} 1, 5 and 15-minute load averages at the start: "
                f"{load_at_start}, at the end: "
                f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.").strip()
            out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {out}")
        return
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for mib in args.mib:
            for tree in args.trees:
                row = measure(tree, mib, args.repeats, Path(tmp))
                rows.append(row)
                print(f"{tree:9s} {row['mib']:4d} MiB  save/plain {row['save_ratio']:.2f}x "
                      f"[{row['save_ratio_lo']:.2f}, {row['save_ratio_hi']:.2f}]  "
                      f"load thr/plain {row['load_ratio']:.2f}x [{row['load_ratio_lo']:.2f}, "
                      f"{row['load_ratio_hi']:.2f}]  wall ms {row['median_ms']}  cpu ms "
                      f"{row['median_cpu_ms']}  minor faults {row['median_faults']}", flush=True)
    if args.write:
        data = {"method": f"Median over {args.repeats} interleaved repeats [min, max] of the "
                          "per-repeat ratio of wall times, and the ratio of median CPU times "
                          "(every thread of the process, the digest's helpers included); torch "
                          "on one thread; the plain side is the library's own save into a file "
                          "+ the same fsync, and its own load of that file (page cache warm "
                          "for both).",
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                           f"{platform.python_version()}, torch {torch.__version__}, NumPy "
                           f"{np.__version__}",
                "conditions": f"{args.conditions} 1, 5 and 15-minute load averages at the "
                              f"start: {load_at_start}, at the end: "
                              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.".strip(),
                "targets": TARGETS, "rows": rows, "digests": digests}
        data["digests_conditions"] = data["conditions"]
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
