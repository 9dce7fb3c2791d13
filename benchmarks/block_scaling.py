"""Quantize throughput of the block-scaling recipes: torch_impl against torchao's CPU path,
and the NumPy reference for scale.

    python benchmarks/block_scaling.py [--quick] [--repeats 7] [--clock thread|wall]

One float32 N(0, 1) matrix (1024 x 2048, or 256 x 512 with --quick; bfloat16 values where
the RHT needs them), one thread (torch.set_num_threads(1); NumPy single-threaded). One
repeat times every row's candidates back to back, each call once (after one warm-up call
per candidate), so a ratio is measured side by side; the table gives the median and the
interquartile range over repeats of elements per second, and the median of each repeat's
ratio to the row's torchao column (torchao time / our time: above 1, ours is faster).

What is compared (torchao 0.18.0, CPU, no Triton):
- NVFP4 1x16: torchao's `nvfp4_quantize` with a per-tensor scale (two levels, the amax and
  `per_tensor_amax_to_scale` inside the timing, as `NVFP4Tensor.to_nvfp4` does) and
  `NVFP4Tensor.to_nvfp4` itself (the same plus the tensor subclass). torchao has no 16x16
  tile, no RHT and no stochastic rounding on CPU: those rows have no torchao column.
- Blockwise fp8: torchao's training rule (`torch_blockwise_scale_act_quant_lhs`,
  `torch_blockwise_scale_weight_quant`) lives in prototype/blockwise_fp8_training/kernels.py,
  which imports triton at its top: it does not import here. torchao.kernel's
  `fp8_blockwise_act_quant` / `fp8_blockwise_weight_quant` import but raise "unsupported
  without triton". What runs on CPU is torchao.quantization's PerBlock float8 path
  (`_choose_scale_float8` + `_quantize_affine_float8`, block [1, 128] or [128, 128]): scale
  amax / 448 with no floor, x / scale. A different rule from every variant here (not
  bit-equal to any), timed as the nearest thing torchao runs on CPU.
- bf16 stochastic rounding: torchao's `_fp32_to_bf16_sr`, which draws its 16-bit randoms
  inside (torch.randint); torch_impl.optim_sr.round_bf16_stochastic takes them as an
  argument, so it is timed twice: on drawn bits, and with the same torch.randint inside.

A measurement, no asserts (the claims are the parity tests'). Prints a Markdown table with
the machine, the versions, the date and the commit, for docs/nvfp4.md and docs/fp8.md.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.formats import cpu_model  # noqa: E402  (the one reading of the CPU's name)
from reference import fp8_blockwise as rfb  # noqa: E402
from reference import nvfp4 as rnv  # noqa: E402
from reference import optim_sr as rsr  # noqa: E402
from torch_impl import fp8_blockwise as tfb  # noqa: E402
from torch_impl import nvfp4 as tnv  # noqa: E402
from torch_impl import optim_sr as tsr  # noqa: E402

Case = tuple[str, str, Callable[[], object]]  # (row, column, the call)
COLUMNS = ("torchao", "torch_impl", "torch_impl + draws", "reference")


def torchao_calls() -> dict[str, Callable[..., object]]:
    """torchao's CPU entry points that import here, by name ({} without torchao)."""
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum notices
    try:
        from torchao.optim.quant_utils import _fp32_to_bf16_sr
        from torchao.prototype.mx_formats.nvfp4_tensor import (
            NVFP4Tensor,
            nvfp4_quantize,
            per_tensor_amax_to_scale,
        )
        from torchao.quantization.quant_primitives import (
            _choose_scale_float8,
            _quantize_affine_float8,
        )
    except ImportError:
        return {}

    def nvfp4(x: torch.Tensor) -> object:
        return nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().amax()))

    def to_nvfp4(x: torch.Tensor) -> object:
        return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().amax()))

    def per_block(x: torch.Tensor, block: list[int]) -> object:
        return _quantize_affine_float8(x, _choose_scale_float8(x, block))

    return {"nvfp4_quantize": nvfp4, "to_nvfp4": to_nvfp4, "per_block": per_block,
            "sr": _fp32_to_bf16_sr}


def cases(m: int, n: int) -> list[Case]:
    """Every (row, column, call) on one (m, n) matrix."""
    g = np.random.default_rng(0)
    x = g.standard_normal((m, n), dtype=np.float32)
    xb = x.astype(ml_dtypes.bfloat16)
    rbits = g.integers(0, 256, (m, n), dtype=np.uint8)
    draws = g.integers(0, 1 << 16, (m, n), dtype=np.int32)
    xt, xbt = torch.from_numpy(x), torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16)
    rbits_t, draws_t = torch.from_numpy(rbits), torch.from_numpy(draws)
    ao = torchao_calls()
    out: list[Case] = []
    for tile in rnv.TILES:
        name = f"nvfp4 {tile[0]}x{tile[1]}"
        if tile == (1, 16) and ao:
            out.append((name, "torchao", lambda: ao["nvfp4_quantize"](xt)))
            out.append((name + " (NVFP4Tensor.to_nvfp4)", "torchao", lambda: ao["to_nvfp4"](xt)))
        out.append((name, "torch_impl", lambda tile=tile: tnv.quantize(xt, tile)))
        out.append((name, "reference", lambda tile=tile: rnv.quantize(x, tile)))
    out.append(("nvfp4 1x16, RHT (bf16 x)", "torch_impl",
                lambda: tnv.quantize(xbt, (1, 16), with_rht=True)))
    out.append(("nvfp4 1x16, RHT (bf16 x)", "reference",
                lambda: rnv.quantize(xb, (1, 16), with_rht=True)))
    out.append(("nvfp4 1x16, SR", "torch_impl",
                lambda: tnv.quantize(xt, (1, 16), rounding="stochastic", rbits=rbits_t)))
    out.append(("nvfp4 1x16, SR", "reference",
                lambda: rnv.quantize(x, (1, 16), rounding="stochastic", rbits=rbits)))
    for tile in (rfb.TILE_1x128, rfb.TILE_128x128):
        for variant in rfb.VARIANTS:
            name = f"fp8 blockwise {tile[0]}x{tile[1]}, {variant}"
            if ao:
                out.append((name, "torchao", lambda tile=tile: ao["per_block"](xt, list(tile))))
            out.append((name, "torch_impl",
                        lambda tile=tile, v=variant: tfb.quantize_blockwise(xt, tile, v)))
            out.append((name, "reference",
                        lambda tile=tile, v=variant: rfb.quantize_blockwise(x, tile, v)))
    for variant in rsr.VARIANTS:
        name = f"bf16 SR, {variant}"
        if ao:
            out.append((name, "torchao", lambda: ao["sr"](xt)))
        out.append((name, "torch_impl",
                    lambda v=variant: tsr.round_bf16_stochastic(xt, draws_t, variant=v)))
        out.append((name, "torch_impl + draws", lambda v=variant: tsr.round_bf16_stochastic(
            xt, torch.randint(0, 1 << 16, xt.shape, dtype=torch.int32), variant=v)))
        out.append((name, "reference",
                    lambda v=variant: rsr.round_bf16_stochastic(x, draws, variant=v)))
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def measure(m: int, n: int, repeats: int, clock: Callable[[], float]) -> dict:
    """{row: {column: {"rate": [elements/s per repeat], "ratio": [torchao time / time]}}}."""
    todo = cases(m, n)
    for _, _, call in todo:
        call()  # warm-up: first-call costs (allocations, lazy imports) are not timed
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in range(repeats):
        seconds: dict[tuple[str, str], float] = {}
        for row, column, call in todo:
            start = clock()
            call()
            seconds[(row, column)] = clock() - start
        for (row, column), s in seconds.items():
            entry = rows.setdefault(row, {}).setdefault(column, {"rate": [], "ratio": []})
            entry["rate"].append(m * n / s)
            base = seconds.get((row, "torchao"))
            if base is not None:
                entry["ratio"].append(base / s)
        print(f"repeat {r + 1}/{repeats} done", file=sys.stderr)
    return rows


def header(m: int, n: int, repeats: int, clock_name: str, load: float) -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    try:
        import torchao

        ao = f"torchao {torchao.__version__}"
    except ImportError:
        ao = "torchao not installed"
    return (f"Measured {datetime.date.today().isoformat()} at commit {commit} by "
            f"`python benchmarks/block_scaling.py{' --quick' if m < 1024 else ''}`: "
            f"{cpu_model()}, {os.cpu_count()} logical CPUs (1-minute load {load:.1f} at the "
            f"start, {os.getloadavg()[0]:.1f} at the end), one thread; torch "
            f"{torch.__version__}, {ao}, numpy {np.__version__}; a {m} x {n} float32 N(0, 1) "
            f"matrix, {repeats} repeats, {clock_name} clock. Million elements per second, "
            "median [interquartile range]; ratio = torchao's time / this column's, median "
            "of the per-repeat ratios (above 1: faster than torchao).")


def table(rows: dict) -> str:
    def rate(entry: dict | None) -> str:
        if entry is None:
            return "-"
        q1, med, q3 = quartiles(entry["rate"])
        return f"{med / 1e6:.1f} [{q1 / 1e6:.1f}, {q3 / 1e6:.1f}]"

    def ratio(entry: dict | None) -> str:
        return f"{statistics.median(entry['ratio']):.2f}x" if entry and entry["ratio"] else "-"

    lines = ["| quantize | torchao | torch_impl | ratio | torch_impl + draws | ratio | "
             "reference | ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row, by_column in rows.items():
        cells = [rate(by_column.get("torchao"))]
        for column in COLUMNS[1:]:
            cells += [rate(by_column.get(column)), ratio(by_column.get(column))]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 256 x 512 matrix, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="default 7 (--quick: 3)")
    parser.add_argument("--clock", choices=("thread", "wall"), default="thread")
    args = parser.parse_args()
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    if repeats < 2:
        parser.error("--repeats must be at least 2 (the spread needs two samples)")
    m, n = (256, 512) if args.quick else (1024, 2048)
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    rows = measure(m, n, repeats, clock)
    print(header(m, n, repeats, args.clock, load))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
