"""The non-finite check and unscale: reference (NumPy) against torch's fused kernel.

Both sides unscale the same float32 gradients of a few model-sized tensors; the reference
runs loss_scale_kernels.non_finite_check_and_unscale_ (isfinite + multiply per tensor),
torch runs torch._amp_foreach_non_finite_check_and_unscale_ once per dtype group.

Method: wall time (time.perf_counter) of one call, torch on one thread
(torch.set_num_threads(1)), NumPy single-threaded. Each repeat times the two sides back to
back, alternating which goes first, and forms their ratio, so a slow moment of a shared
machine hits both; printed: the median and the interquartile range over the repeats of each
side and of the ratio. Run: python benchmarks/loss_scaling.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from reference import loss_scale_kernels as kernels

SIZES = {"compact (8-32-32-1)": [(32, 8), (32,), (32, 32), (32,), (1, 32), (1,)],
         "4 x 1M": [(1024, 1024)] * 4}
REPEATS = 21


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def interleaved(ref: Callable[[], object], native: Callable[[], object],
                repeats: int = REPEATS) -> dict[str, tuple[float, float, float]]:
    """Per repeat: the seconds of one call of each side (alternating which goes first, one
    warm-up call each) and reference / torch; their median and quartiles."""
    ref(), native()
    samples: dict[str, list[float]] = {"reference": [], "torch": [], "ratio": []}
    for i in range(repeats):
        pair = {}
        for side, fn in (("reference", ref), ("torch", native))[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            fn()
            pair[side] = time.perf_counter() - start
        samples["reference"].append(pair["reference"])
        samples["torch"].append(pair["torch"])
        samples["ratio"].append(pair["reference"] / pair["torch"])
    return {k: quartiles(v) for k, v in samples.items()}


def main() -> None:
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    print(f"wall time (time.perf_counter) of one call; torch {torch.__version__} on "
          f"{torch.get_num_threads()} thread, NumPy single-threaded; {REPEATS} interleaved "
          "repeats: median [interquartile range]")
    print(f"{'gradients':<22}{'reference us':>24}{'torch fused us':>24}{'reference/torch':>24}")
    for name, shapes in SIZES.items():
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        inv = kernels.inv_scale(np.float32(3.0))  # not a power of two: the multiply is real
        found_ref = np.array(0.0, dtype=np.float32)
        t_grads = [torch.from_numpy(g.copy()) for g in grads]
        t_inv, found = torch.tensor(float(inv)), torch.zeros(())

        got = interleaved(
            lambda: kernels.non_finite_check_and_unscale_(grads, found_ref, inv),  # noqa: B023
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(
                t_grads, found, t_inv))  # noqa: B023
        cells = [f"{m * k:.1f} [{a * k:.1f}, {b * k:.1f}]" for (m, a, b), k in
                 ((got["reference"], 1e6), (got["torch"], 1e6), (got["ratio"], 1))]
        print(f"{name:<22}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
