"""Pictures of the number formats: the spacing of representable values."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import reference.formats as ref
from parity.oracles import STORAGE_FORMATS
from parity.pictures import picture


@picture("formats_spacing.png")
def _(path: Path) -> None:
    """Spacing of representable values against magnitude, log-log: full range and a zoom."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for name in STORAGE_FORMATS:
        fmt = ref.FORMATS[name]
        codes = np.arange(fmt.max_code + 1).astype(fmt.code_dtype)
        values = ref.decode(codes, name)
        spacing = np.diff(values)
        for ax in axes:
            line, = ax.step(values[1:], spacing, where="post",
                            label=f"{name} (e{fmt.exponent_bits}m{fmt.mantissa_bits})")
            ax.axvline(fmt.tiny, color=line.get_color(), linestyle=":", linewidth=0.8)
    for ax, title in zip(axes, ("whole range", "zoom: the fp16 and fp8 ranges"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("magnitude |x|  (dotted: tiny, the smallest normal)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("spacing to the next representable value")
    axes[1].set_xlim(2.0**-26, 2.0**17)
    axes[1].set_ylim(2.0**-26, 2.0**14)
    axes[1].legend(loc="upper left")
    fig.suptitle("Spacing is flat across the subnormals and proportional to |x| above tiny")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
