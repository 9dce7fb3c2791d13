"""The non-finite check and unscale: reference (NumPy) against torch's fused kernel.

Both sides unscale the same float32 gradients of a few model-sized tensors; the reference
runs loss_scale_kernels.non_finite_check_and_unscale_ (isfinite + multiply per tensor),
torch runs torch._amp_foreach_non_finite_check_and_unscale_ once per dtype group. Prints
medians of repeated runs side by side and their ratio. Run: python benchmarks/loss_scaling.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from reference import loss_scale_kernels as kernels

SIZES = {"compact (8-32-32-1)": [(32, 8), (32,), (32, 32), (32,), (1, 32), (1,)],
         "4 x 1M": [(1024, 1024)] * 4}
REPEATS = 21


def _median_seconds(fn, repeats: int = REPEATS) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {REPEATS}")
    print(f"{'gradients':<22}{'reference':>12}{'torch fused':>14}{'ratio':>8}")
    for name, shapes in SIZES.items():
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        inv = kernels.inv_scale(np.float32(3.0))  # not a power of two: the multiply is real
        found_ref = np.array(0.0, dtype=np.float32)
        t_grads = [torch.from_numpy(g.copy()) for g in grads]
        t_inv, found = torch.tensor(float(inv)), torch.zeros(())

        ref_s = _median_seconds(
            lambda: kernels.non_finite_check_and_unscale_(grads, found_ref, inv))  # noqa: B023
        torch_s = _median_seconds(
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(t_grads, found, t_inv))  # noqa: B023
        print(f"{name:<22}{ref_s * 1e6:>10.1f}us{torch_s * 1e6:>12.1f}us"
              f"{ref_s / torch_s:>7.1f}x")


if __name__ == "__main__":
    main()
