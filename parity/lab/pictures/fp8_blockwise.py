"""docs/fp8.md's blockwise picture: the scales one weight matrix with a few outlier rows gets
under each variant of reference.fp8_blockwise, per 128x128 tile and per 1x128 tile."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.lab.pictures import picture
from reference import fp8_blockwise as rbw

SHAPE = (512, 768)  # 4 x 6 weight tiles of 128 x 128
OUTLIER_ROWS = (40, 300, 301)  # rows 2^10 larger than the rest
E4M3_TINY = 2.0**-6  # float8_e4m3fn's smallest normal, 0x1p-6


def outlier_weight(seed: int = 0) -> np.ndarray:
    """A float32 (512, 768) weight, N(0, 0.02^2) (a typical init), rows 40, 300 and 301
    2^10 larger."""
    w = (np.random.default_rng(seed).standard_normal(SHAPE) * 0.02).astype(np.float32)
    w[list(OUTLIER_ROWS)] *= np.float32(2**10)
    return w


def below_normal(w: np.ndarray, tile: tuple[int, int], variant: str) -> np.ndarray:
    """(M, N) bool: the elements whose scaled |w| falls below e4m3's normal range (2^-6), to
    a subnormal with fewer significant bits, or to 0."""
    multiplier, _ = rbw.block_scales(w, tile, variant)
    per_element = np.repeat(np.repeat(multiplier, tile[0], axis=0), tile[1], axis=1)
    return np.abs(w.astype(np.float64)) * per_element[: w.shape[0], : w.shape[1]] < E4M3_TINY


@picture("fp8_blockwise_scales.png")
def draw_scales(path: Path) -> None:
    """The stored (decode) scales of one 512 x 768 weight, N(0, 0.02^2) with rows 40, 300 and
    301 2^10 larger, under each variant: top, per 128x128 tile (the weights' recipe); bottom,
    per 1x128 tile (the activations' recipe applied to the same matrix), log2 of the scale,
    one colour for the same value in all six. A 128x128 tile holding an outlier row takes a
    scale about 2^10 larger, which moves its other 127 rows' values 10 binades down: e4m3
    has room for most of them, but the smallest fall below its normal range (2^-6) and keep
    fewer bits or none; each title gives that share beside an outlier row and elsewhere.
    1x128 tiles confine the outlier to its own rows. deepseek and torchao store the same
    scale up to the last bit; transformer_engine's is a power of two, up to 2x larger (its
    encode factor rounded down), so its tiles change colour in whole steps and a few more
    values fall below the normals."""
    import matplotlib.pyplot as plt

    w = outlier_weight()
    tiles = (rbw.TILE_128x128, rbw.TILE_1x128)
    scales = {(t, v): np.log2(rbw.quantize_blockwise(w, t, v)[1].astype(np.float64))
              for t in tiles for v in rbw.VARIANTS}
    low = min(float(s.min()) for s in scales.values())
    high = max(float(s.max()) for s in scales.values())
    outlier = np.zeros(SHAPE, bool)
    outlier[list(OUTLIER_ROWS)] = True  # (M, N): an outlier row's elements
    fig, axes = plt.subplots(2, len(rbw.VARIANTS), figsize=(13, 8), layout="constrained",
                             gridspec_kw={"height_ratios": [1, 1.3]})
    for row, tile in enumerate(tiles):
        for col, variant in enumerate(rbw.VARIANTS):
            ax = axes[row, col]
            image = ax.imshow(scales[(tile, variant)], aspect="auto", cmap="viridis",
                              vmin=low, vmax=high, interpolation="nearest",
                              extent=(0, SHAPE[1], SHAPE[0], 0))
            small = below_normal(w, tile, variant)
            groups = {r // tile[0] for r in OUTLIER_ROWS}  # tile rows holding an outlier
            rows = [i // tile[0] in groups and i not in OUTLIER_ROWS for i in range(SHAPE[0])]
            sharing = np.broadcast_to(np.array(rows)[:, None], SHAPE)  # beside an outlier
            alone = f"elsewhere {np.mean(small[~sharing & ~outlier]):.2%}"
            share = (f"beside an outlier row {np.mean(small[sharing]):.1%}, {alone}"
                     if sharing.any() else f"{alone} (no tile shared with an outlier)")
            ax.set_title(f"{variant}, {tile[0]}x{tile[1]} tiles\nbelow e4m3's normals once "
                         f"scaled:\n{share}", fontsize=8)
            ax.set_xticks(range(0, SHAPE[1] + 1, 256))
            ax.set_yticks(range(0, SHAPE[0] + 1, 128))
            if col == 0:
                ax.set_ylabel("row")
            if row == 1:
                ax.set_xlabel("column")
            for r in OUTLIER_ROWS:
                ax.axhline(r + 0.5, color="white", lw=0.4, ls=":")
    fig.colorbar(image, ax=axes, label="log2 of the stored scale", shrink=0.6)
    fig.suptitle("Blockwise fp8 scales of a weight with outlier rows (dotted: 40, 300, 301)",
                 fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
