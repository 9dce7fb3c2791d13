"""Cost of a safe checkpoint: atomic save (temp file, fsync, rename, directory fsync, SHA-256)
against a plain torch.save to the same disk, and load+verify throughput.

    python benchmarks/resume.py [--mb 64] [--repeats 7] [--dir DIR]

Prints medians of `repeats` interleaved runs (the machine is noisy) and their ratio. The
plain torch.save is given the same fsync the atomic save does, in a second column, so the
ratio separates "durability" from "atomicity + digest". Never asserted in tests.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torch_impl import resume


def _state(mb: float) -> dict:
    n = int(mb * 2**20 / 4 / 3)  # params, exp_avg, exp_avg_sq of n float32 each
    g = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(n, generator=g)},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(n, generator=g),
                                        "exp_avg_sq": torch.rand(n, generator=g),
                                        "step": torch.tensor(10.0)}}}}


def _plain_save(state: dict, path: Path, fsync: bool) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=64.0, help="state size in MiB")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    state = _state(args.mb)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        times: dict[str, list[float]] = {"torch.save": [], "torch.save+fsync": [],
                                         "save_checkpoint": [], "load_checkpoint": [],
                                         "torch.load": []}
        for _ in range(args.repeats):
            for name, fn in (
                ("torch.save", lambda: _plain_save(state, d / "plain.pt", fsync=False)),
                ("torch.save+fsync", lambda: _plain_save(state, d / "plainf.pt", fsync=True)),
                ("save_checkpoint", lambda: resume.save_checkpoint(d / "a.ckpt", state)),
                ("load_checkpoint", lambda: resume.load_checkpoint(d / "a.ckpt")),
                ("torch.load", lambda: torch.load(io.BytesIO((d / "plain.pt").read_bytes()),
                                                  weights_only=True)),
            ):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        size = (d / "a.ckpt").stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"state: {size / 2**20:.1f} MiB, {args.repeats} repeats, medians")
    for k, v in med.items():
        print(f"  {k:18s} {v * 1e3:8.1f} ms   {size / 2**20 / v:8.0f} MiB/s")
    print(f"atomic save / torch.save        = {med['save_checkpoint'] / med['torch.save']:.2f}x")
    print(f"atomic save / torch.save+fsync  = "
          f"{med['save_checkpoint'] / med['torch.save+fsync']:.2f}x")
    print(f"load+verify throughput          = {size / 2**20 / med['load_checkpoint']:.0f} MiB/s "
          f"(torch.load alone: {size / 2**20 / med['torch.load']:.0f} MiB/s)")


if __name__ == "__main__":
    main()
