"""The loss-scaling pictures of docs/loss_scaling.md: the scale over a float16 run, and the
compact model's gradient exponents against float16's range."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from parity.drivers.loss_scaling import underflow_batch, underflow_models
from parity.drivers.loss_scaling_train import train_runs
from parity.lab.pictures import picture
from reference import nn as rnn


@picture("loss_scaling_trajectory.png")
def draw_trajectory(path: Path) -> None:
    """The scale over a float16 run with overflow events marked (both implementations)."""
    import matplotlib.pyplot as plt

    run = train_runs("fp16", steps=120, init_scale=2.0**24, growth_interval=8)
    ref_scales = [r.scale for r in run["ref"]]
    torch_scales = [t.scale for t in run["torch"]]
    skips = [i for i, r in enumerate(run["ref"]) if r.skipped]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.step(range(len(ref_scales)), ref_scales, where="post", label="reference")
    ax.step(range(len(torch_scales)), torch_scales, where="post", linestyle="--",
            label="torch.amp.GradScaler")
    ax.scatter(skips, [ref_scales[i] for i in skips], color="red", zorder=3,
               label="overflow: step skipped, scale backed off")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale S")
    ax.set_title("Dynamic loss scale (fp16, init 2^24, growth_interval 8)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@picture("loss_scaling_exponents.png")
def draw_exponents(path: Path) -> None:
    """Histogram of log2|g| of the compact model's float32 gradients against fp16's range."""
    import matplotlib.pyplot as plt

    ref, _ = underflow_models()
    x, y = underflow_batch()
    loss_fn = rnn.MSELoss()
    loss_fn(ref(x), y)
    ref.backward(loss_fn.backward())
    g = np.concatenate([p.grad.ravel() for p in ref.parameters()])
    e = np.log2(np.abs(g[g != 0]))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bins = np.arange(np.floor(e.min()) - 1, 18)
    ax.hist(e, bins=bins, color="grey", label="float32 gradients (S = 1)")
    ax.hist(e + 16, bins=np.arange(bins[0], 34), histtype="step", color="C0",
            label="the same, scaled by S = 2^16")
    ax.axvspan(bins[0], -25, color="red", alpha=0.15, label="fp16: rounds to 0 (< 2^-25)")
    ax.axvspan(-25, -14, color="orange", alpha=0.15, label="fp16 subnormal (2^-24 .. 2^-14)")
    ax.axvline(16, color="black", linestyle=":", label="fp16 max 65504 (~2^16)")
    ax.set_xlabel("log2 |g|")
    ax.set_ylabel("elements")
    ax.set_title("Gradient exponents of the compact model (small-init output layer)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
