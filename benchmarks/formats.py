"""Encode throughput: the reference's integer rounding against native conversions.

    python benchmarks/formats.py [--repeats 30]

On cache-resident chunks of random float32 bit patterns (2^15 inputs: 128 KiB), one
thread, for each 8/16-bit format: reference.formats.encode, torch's cast
(`Tensor.to(dtype)`, hardware conversion instructions where the CPU has them), ml_dtypes'
astype, and numpy's astype(float16). Prints the median time per element and the ratios,
all measured side by side in one run (this machine is noisy: compare ratios).

Targets from the formats issue: reference >= 0.1x torch's cast, and >= 10x
numpy.astype(float16) on random bit patterns.

Note on allocation: NumPy's temporaries of a few hundred KiB are fresh mmap'd pages under
glibc's default mmap threshold (every operation then page-faults its output); importing
torch raises that threshold as a side effect. torch is imported here before timing, so the
reference is timed as it runs in this project; without torch it is ~4x slower per element
at this chunk size.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import ml_dtypes
import numpy as np
import torch

import reference.formats as ref

CHUNK = 1 << 15
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float8_e5m2": torch.float8_e5m2, "float8_e4m3fn": torch.float8_e4m3fn}
ML = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
      "float8_e5m2": ml_dtypes.float8_e5m2, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}


def median_ns_per_element(fn: object, repeats: int, n: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, size=CHUNK, dtype=np.uint32).view(np.float32)
    xt = torch.from_numpy(x)
    warnings.simplefilter("ignore", RuntimeWarning)  # overflow in numpy's casts is the point

    print(f"random float32 bit patterns, chunks of {CHUNK} inputs, 1 thread, "
          f"median of {args.repeats}; ns per element")
    head = (f"{'format':<15}{'reference':>10}{'torch':>9}{'ml_dtypes':>11}"
            f"{'np f16':>9}{'ref/torch':>11}{'np16/ref':>10}")
    print(head)
    for name, dtype in TORCH_DTYPES.items():
        ref.encode(x, name)  # warm up
        t_ref = median_ns_per_element(lambda n=name: ref.encode(x, n), args.repeats, CHUNK)
        t_torch = median_ns_per_element(lambda d=dtype: xt.to(d), args.repeats, CHUNK)
        t_ml = median_ns_per_element(lambda n=name: x.astype(ML[n]), args.repeats, CHUNK)
        t_np = median_ns_per_element(lambda: x.astype(np.float16), args.repeats, CHUNK)
        print(f"{name:<15}{t_ref:>10.2f}{t_torch:>9.3f}{t_ml:>11.2f}{t_np:>9.2f}"
              f"{t_torch / t_ref:>10.3f}x{t_np / t_ref:>9.1f}x")
    print("\nref/torch: the reference's speed as a fraction of torch's cast (target >= 0.1x);")
    print("np16/ref: how many times faster the reference is than numpy.astype(float16) "
          "(target >= 10x).")


if __name__ == "__main__":
    main()
