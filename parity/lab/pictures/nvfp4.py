"""docs/nvfp4.md's picture: the random Hadamard transform flattening one outlier of a 1x16
group, and what it does to the group's fp4 error (reference.nvfp4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from parity.lab.pictures import picture
from reference import nvfp4 as rnv

OUTLIER = (5, 8.0)  # (index, value) of the group's one outlier
FP4_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def outlier_group(seed: int = 3) -> np.ndarray:
    """One bfloat16 group (1, 16): fifteen N(0, 0.5^2) values and one outlier of 8."""
    x = (np.random.default_rng(seed).standard_normal(16) * 0.5).astype(np.float32)
    x[OUTLIER[0]] = OUTLIER[1]
    return x.astype(ml_dtypes.bfloat16).reshape(1, 16)


def rht_errors(x: np.ndarray) -> dict[str, Any]:
    """For a bfloat16 (1, 16) group x: its values, its RHT y, each one's fp4 round trip
    (quantize, dequantize; the tensor's amax as A) and grid step, and the error of each
    element in x's coordinates, float64, without and with the RHT (the RHT undone exactly:
    y M^T with M's entries +-1/4)."""
    x32 = x.astype(np.float64)
    codes, scales, amax = rnv.quantize(x, (1, 16))
    plain = rnv.dequantize(codes, scales, amax).astype(np.float64)
    y = rnv.rht(x).astype(np.float64)
    codes_r, scales_r, amax_r = rnv.quantize(x, (1, 16), with_rht=True)
    rotated = rnv.dequantize(codes_r, scales_r, amax_r).astype(np.float64)
    back = rotated @ rnv.rht_matrix().astype(np.float64).T
    unit = rnv.dequantize(np.array([[2]], np.uint8), scales[:, :1], amax)[0, 0]  # code 2: 1.0
    unit_r = rnv.dequantize(np.array([[2]], np.uint8), scales_r[:, :1], amax_r)[0, 0]
    return {"x": x32[0], "y": y[0], "x_fp4": plain[0], "y_fp4": rotated[0],
            "unit": float(unit), "unit_rht": float(unit_r),
            "error": np.abs(plain - x32)[0], "error_rht": np.abs(back - x32)[0],
            "zeros": int(np.sum(codes[0] & 7 == 0)), "zeros_rht": int(np.sum(codes_r[0] & 7 == 0))}


@picture("nvfp4_rht.png")
def draw_rht(path: Path) -> None:
    """A 1x16 group with one outlier (8 among fifteen N(0, 0.25) values), quantized to NVFP4
    by reference.nvfp4.quantize without and with the random Hadamard transform (TE's 16x16
    sign vector). Left: the values, the fp4 values they round to (dots) and the group's fp4
    grid (lines): the outlier sets the scale, and many small values round to 0. Middle: after
    the RHT the outlier is spread over all sixteen (each +-8/4 plus a mix of the rest): the
    amax falls to about 3.5 and no value rounds to 0. Right: each element's error in x's
    coordinates (the RHT undone exactly): without the RHT the outlier is exact and each small
    value loses itself; with it the error is spread evenly over the sixteen, and its total
    (RMS in the legend) is not smaller. The RHT buys a flat group, not a smaller error."""
    import matplotlib.pyplot as plt

    e = rht_errors(outlier_group())
    idx = np.arange(16)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, unit, zeros, title in ((axes[0], "x", e["unit"], e["zeros"], "x (bfloat16)"),
                                        (axes[1], "y", e["unit_rht"], e["zeros_rht"],
                                         "y = RHT(x) = x M, M = diag(s) H / 4")):
        for level in FP4_GRID * unit:
            for sign in (1, -1):
                ax.axhline(sign * level, color="0.85", lw=0.6, zorder=0)
        ax.bar(idx, e[key], color="tab:blue", width=0.7, label="value")
        ax.plot(idx, e[key + "_fp4"], "o", color="tab:red", ms=4, label="its fp4 value")
        ax.set_title(f"{title}\namax {np.max(np.abs(e[key])):.2f}; {zeros} of 16 "
                     "codes are 0", fontsize=9)
        ax.set_xticks(idx[::3])
        ax.set_xlabel("element of the group")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("value (grey: the group's fp4 grid)")
    rms, rms_r = (float(np.sqrt(np.mean(e[k] ** 2))) for k in ("error", "error_rht"))
    axes[2].bar(idx - 0.18, e["error"], width=0.36, color="tab:blue",
                label=f"without the RHT (RMS {rms:.3f})")
    axes[2].bar(idx + 0.18, e["error_rht"], width=0.36, color="tab:orange",
                label=f"with it, undone (RMS {rms_r:.3f})")
    axes[2].set_title("|fp4 value - x| per element, in x's coordinates", fontsize=9)
    axes[2].set_xticks(idx[::3])
    axes[2].set_xlabel("element of the group")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
