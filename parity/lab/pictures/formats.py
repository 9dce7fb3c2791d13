"""Pictures of the number formats: the spacing of representable values, and the encode
benchmark (from the committed docs/data/formats_encode.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference.formats as ref
from parity.drivers.formats import ENCODE_TARGETS, encode_benchmark
from parity.lab.pictures import picture
from parity.oracles import STORAGE_FORMATS


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


def _band(ax: Any, rows: list[dict], key: str, style: str, label: str,
          color: Any = None) -> Any:
    """Medians of rows[key] against size, the interquartile range shaded; the line's color."""
    sizes = [2 ** r["log2_size"] for r in rows]
    line, = ax.plot(sizes, [r[key]["median"] for r in rows], style, color=color, label=label)
    ax.fill_between(sizes, [r[key]["q1"] for r in rows], [r[key]["q3"] for r in rows],
                    color=line.get_color(), alpha=0.2)
    return line.get_color()


@picture("formats_encode.png")
def _(path: Path) -> None:
    """The encode benchmark (docs/data/formats_encode.json): ns per element against array
    size for the reference and torch's cast, and their ratio, medians with the IQR shaded."""
    import matplotlib.pyplot as plt

    bench = encode_benchmark()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for name in STORAGE_FORMATS:
        rows = sorted((r for r in bench["rows"] if r["format"] == name),
                      key=lambda r: r["log2_size"])
        color = _band(left, rows, "reference_ns", "-o", f"{name} reference")
        _band(left, rows, "torch_ns", "--", f"{name} torch", color)
        _band(right, rows, "ratio", "-o", name, color)
    for target in sorted(set(ENCODE_TARGETS.values())):
        which = ", ".join(n for n, t in ENCODE_TARGETS.items() if t == target)
        right.axhline(target, color="gray", linestyle=":", linewidth=1.2)
        right.annotate(f"target {target:g}: {which}", (2.0**10, target), fontsize=7,
                       color="gray", xytext=(0, 3), textcoords="offset points")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("elements per call")
        ax.grid(True, which="major", alpha=0.3)
    left.set_ylabel("ns per element")
    left.set_title("reference encode (solid) and torch's cast (dashed)")
    left.legend(fontsize=7, ncol=2)
    right.set_ylabel("torch time / reference time")
    right.set_title("speed relative to torch (dotted: the targets)")
    right.legend(fontsize=8)
    fig.suptitle(f"{bench['clock']}, one thread, {bench['repeats']} interleaved repeats: "
                 "median, IQR shaded", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
