"""docs/loss_scaling.md: the autocast op table, the float16 underflow table, the unscale
figures and the reference's training runs, all computed by the reference (NumPy only, so
the page does not depend on the installed torch; the parity claims tie torch to it)."""

from __future__ import annotations

import numpy as np

from parity.claims import loss_scaling as lsc
from parity.lab.gendocs import section
from reference import amp
from reference import loss_scaling as rls
from reference import nn as rnn
from reference import optim as ropt
from reference import train as rtrain

OPS = ("linear", "addmm", "mm", "matmul", "bmm", "mv", "addmv", "mse_loss",
       "cross_entropy_loss", "log_softmax", "softmax", "layer_norm", "gelu", "tanh", "relu",
       "dropout")


@section("loss_scaling.md", "autocast-op-table")
def op_table() -> str:
    rows = ["| op | CPU | CUDA |", "|---|---|---|"]
    for op in OPS:
        cells = [amp.op_policy(op, d) or "not listed: runs in its input's dtype"
                 for d in ("cpu", "cuda")]
        rows.append(f"| {op} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def _underflow_grads(dtype: str | None, scale: float) -> dict[str, np.ndarray]:
    """The unscaled gradients of one backward of scale * loss of the small-init model."""
    from parity.drivers.loss_scaling import underflow_batch

    model = rnn.make_mlp((16, 64, 64, 4), "gelu", rng=np.random.default_rng(1))
    model[4].weight.data *= np.float32(2.0**-10)
    x, y = underflow_batch()
    loss_fn = rnn.MSELoss()
    with amp.autocast(dtype):
        loss_fn(model(x), y)
    model.backward(loss_fn.backward(np.float32(scale)))
    return {name: p.grad / np.float32(scale) for name, p in model.named_parameters()}


@section("loss_scaling.md", "underflow-table")
def underflow_table() -> str:
    exact = _underflow_grads(None, 1.0)
    names = list(exact)
    rows = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    cases = [("fp16, S = 1", "float16", 1.0), ("fp16, S = 2^16", "float16", 2.0**16),
             ("bf16, S = 1", "bfloat16", 1.0)]
    errors = []
    for label, dtype, scale in cases:
        grads = _underflow_grads(dtype, scale)
        rows.append(f"| zeros, {label} | " + " | ".join(
            f"{np.mean(grads[k] == 0):.1%}" for k in names) + " |")
        errors.append(f"| error, {label} | " + " | ".join(
            f"{np.linalg.norm(grads[k] - exact[k]) / np.linalg.norm(exact[k]):.2%}"
            for k in names) + " |")
    return "\n".join(rows + errors)


@section("loss_scaling.md", "unscale-reciprocal")
def unscale_figures() -> str:
    g = np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)
    parts = []
    for scale in (3.0, 1000.0, 2.0**13):
        inv = np.float32(1.0 / np.float64(np.float32(scale)))
        differ = float(np.mean(g * inv != g / np.float32(scale)))
        parts.append(f"S = {scale:g}: {differ:.1%}")
    return ("On a million standard-normal float32 gradients, `g * inv != g / S` for "
            + ", ".join(parts) + " of the elements.")


@section("loss_scaling.md", "training-runs")
def training_runs() -> str:
    from parity.drivers.loss_scaling_train import regression_batch

    rows = ["| precision | loss reduction | steps clipped | steps skipped | final scale |",
            "|---|---|---|---|---|"]
    for precision in ("fp16", "bf16", "fp32"):
        model = rnn.make_mlp((8, 32, 32, 1), "gelu", rng=np.random.default_rng(1))
        opt = ropt.SGD(model.parameters(), lr=0.1)
        scaler = rls.make_scaler(precision, init_scale=2.0**16, growth_interval=10)
        rng = np.random.default_rng(2)
        results = []
        for _ in range(lsc.TRAIN_STEPS):
            x, y = regression_batch(rng)
            with np.errstate(over="ignore", invalid="ignore"):
                results.append(rtrain.train_step(
                    model, rnn.MSELoss(), opt, scaler, x, y, precision=precision,
                    max_grad_norm=lsc.TRAIN_MAX_GRAD_NORM))
        losses = np.array([r.loss for r in results])
        reduction = 1 - losses[-5:].mean() / losses[:5].mean()
        clipped = sum(r.grad_norm > lsc.TRAIN_MAX_GRAD_NORM and not r.skipped for r in results)
        rows.append(f"| {precision} | {reduction:.1%} | {clipped} | "
                    f"{sum(r.skipped for r in results)} | {scaler.get_scale():g} |")
    return "\n".join(rows)
