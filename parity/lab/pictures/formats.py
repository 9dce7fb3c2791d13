"""Pictures of the number formats: the spacing of representable values, the encode
benchmark (from the committed docs/data/formats_encode.json), and where the small formats'
values lie."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import reference.formats as ref
from parity.drivers.formats import ENCODE_TARGETS, encode_benchmark
from parity.lab.pictures import picture
from parity.oracles import SMALL_FORMATS, STORAGE_FORMATS


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


CLIP = 20  # log2 range shown: E8M0's 255 powers of two would squeeze every other row


@picture("formats_small_values.png")
def _(path: Path) -> None:
    """Where each small format's positive finite values lie, on a log2 axis: one row per
    format (the classic float8s beside them), subnormals apart from normals."""
    import matplotlib.pyplot as plt

    names = (*SMALL_FORMATS, "float8_e4m3fn", "float8_e5m2")
    fig, ax = plt.subplots(figsize=(11, 5.2))
    for row, name in enumerate(names):
        fmt = ref.FORMATS[name]
        values = ref.decode(np.arange(2 ** (fmt.bits - int(fmt.signed))).astype(fmt.code_dtype),
                            name)
        values = values[np.isfinite(values) & (values > 0)]
        normal = values >= fmt.tiny
        y = np.full(values.size, -row)
        ax.scatter(np.log2(values[normal]), y[normal], marker="|", s=70, linewidths=0.7,
                   color="C0",
                   label="normal" if row == 0 else None)
        ax.scatter(np.log2(values[~normal]), y[~normal], marker="|", s=70, linewidths=0.7,
                   color="C1",
                   label="subnormal" if row == 0 else None)
        at = min(np.log2(fmt.max), CLIP)
        note = f"max {fmt.max:g}" if at < CLIP else f"... on to max 2^{fmt.emax} (clipped)"
        ax.annotate(note, (at, -row), xytext=(6, -3), textcoords="offset points", fontsize=7)
    ax.set_yticks([-r for r in range(len(names))],
                  [f"{n} (e{ref.FORMATS[n].exponent_bits}m{ref.FORMATS[n].mantissa_bits})"
                   for n in names], fontsize=8)
    ax.set_xlim(-CLIP, CLIP + 6)
    ax.set_xlabel(f"log2 of each positive finite value (E8M0's 2^-127 .. 2^127 clipped at "
                  f"+-{CLIP})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Each small format's positive values: E8M0 powers of two only (over float32's "
                 "whole range), float4/float6 a handful", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
