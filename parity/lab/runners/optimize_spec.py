"""What `optimize --what W --model M` names: the baselines, the learning controls, the
optimizations and which model takes which (parity/lab/runners/optimize.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODELS = ("mlp", "gpt")
# The baselines: a step is milliseconds of matmul, and the whole gauntlet runs in about a
# minute on 2 cores. The MLP learns the teacher task to ~0.89; the transformer is
# `train --model gpt`'s (common/gpt_config.py TRAIN_SHAPE: 4 blocks, width 32, vocab 12,
# block 16) on the copy task of 8 digits, which it learns to copy exactly in 400 steps.
BASELINES: dict[str, dict[str, Any]] = {
    "mlp": {"sizes": (32, 256, 256, 10), "activation": "gelu", "batch_size": 64,
            "num_samples": 2048, "lr": 3e-3, "horizon": 300, "precision": "fp32",
            "recompute": "none"},
    "gpt": {"model": "gpt", "batch_size": 32, "num_samples": 4096, "lr": 3e-3,
            "horizon": 400, "precision": "fp32", "recompute": "none"},
}
BASELINE = BASELINES["mlp"]


@dataclass(frozen=True)
class Controls:
    """The learning controls of one model, stated once: over the last 10 of `steps` steps
    the mean loss is at most `loss_band` x the first step's loss, and `accuracy` (what
    `measures` says) is at least `threshold`."""

    steps: int
    loss_band: float
    threshold: float
    measures: str


CONTROLS = {
    # ln(10) = 2.30 at initialization for 10 balanced classes; the float32 baseline reaches
    # 0.36 / 2.30 = 0.16 and an accuracy of 0.886 (chance: 0.1)
    "mlp": Controls(300, 0.25, 0.80, "over the whole task; chance 0.1"),
    # ln(12) = 2.48 at initialization; 7 of the 16 targets are the next random digit,
    # which no model predicts (ln 11 each at best), so the loss cannot go below
    # 7 ln(11) / 16 = 1.05; the float32 baseline ends near 1.06 = 0.43 x the first loss and
    # copies every digit of the task
    "gpt": Controls(400, 0.50, 0.95, "argmax at the 8 copied positions of every "
                                     "sequence of the task; chance 0.09"),
}
LEARN_STEPS, LOSS_BAND, ACCURACY = (CONTROLS["mlp"].steps, CONTROLS["mlp"].loss_band,
                                    CONTROLS["mlp"].threshold)
RESUME_AT, RESUME_TOTAL = 7, 15
# what each model's gauntlet runs; anything else is a UsageError naming these
SUPPORTED = {"mlp": ("autocast-bf16", "autocast-fp16", "recompute:SPEC", "compile",
                     "loader-workers:N"),
             "gpt": ("autocast-bf16", "recompute:SPEC", "compile")}


@dataclass(frozen=True)
class Optimization:
    """What `--what` names: the config fields it changes and what is known about it."""

    what: str
    changes: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    claims: tuple[str, ...] = ()  # the claims that state its equivalence
    timer: str = "cpu"  # which clock decides: "cpu" (this process) or "wall"
    expectation: str = ""  # what the mechanism predicts, so a null result has its cause
    model: str = "mlp"
    compiled: bool = False  # the model's forward under torch.compile (compiled_forward)


def parse(what: str, model: str = "mlp") -> Optimization:
    """An Optimization of `model` from its spec; ValueError listing the accepted ones."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; accepted: {', '.join(MODELS)}")
    opt = _parse(what)
    head = opt.what.split(":", 1)[0]
    if not any(s.split(":", 1)[0] == head for s in SUPPORTED[model]):
        raise ValueError(f"{what!r} is not supported with --model {model}; supported there: "
                         f"{', '.join(SUPPORTED[model])}")
    if model == "gpt":
        claims = {"autocast-bf16": ("gpt.autocast_layers_bf16",),
                  "recompute": ("recompute.gpt_grads_torch", "recompute.gpt_held_bytes"),
                  "compile": ("compile.gpt_eager", "compile.gpt_reference")}
        expectation = opt.expectation.replace("recompute.held_bytes", "recompute.gpt_held_bytes")
        if head == "compile":
            expectation = ("Inductor fuses each LayerNorm, the attention's scale, mask and "
                           "softmax, the GELU and the residual and bias adds into generated "
                           "loops and keeps the products on the same BLAS kernels; at width 32 "
                           "a step is dominated by per-op overhead, which one graph removes, so "
                           "a gain is expected; the compile is paid once, on the first call, "
                           "and is reported apart")
        opt = Optimization(opt.what, opt.changes, opt.workers, claims[head], opt.timer,
                           expectation, model, opt.compiled)
    if head == "recompute":
        _check_recompute(opt.changes["recompute"], model)
    return opt


def _check_recompute(spec: str, model: str) -> None:
    from common.gpt_config import TRAIN_SHAPE
    from common.recompute_plans import split_recompute
    from reference.recompute_plans import parse_schedule

    if model == "gpt":
        blocks, _ = split_recompute(spec)
        parse_schedule(blocks, TRAIN_SHAPE.n_layer)
    else:
        parse_schedule(spec, 2 * (len(BASELINES["mlp"]["sizes"]) - 1) - 1)


def _parse(what: str) -> Optimization:
    if what in ("autocast-bf16", "autocast-fp16"):
        fmt = what.removeprefix("autocast-")
        return Optimization(
            what, {"precision": fmt}, claims=(f"amp.model_{fmt}", f"amp.linear_{fmt}"),
            expectation=_autocast_expectation(fmt))
    if what.startswith("recompute:"):
        spec = what.removeprefix("recompute:")
        return Optimization(
            what, {"recompute": spec}, claims=("recompute.grads_torch", "recompute.held_bytes"),
            expectation=("recomputation trades time for memory: it re-runs part of the forward "
                         "in backward, so it is expected to be SLOWER (its gain is the held "
                         "bytes, recompute.held_bytes)"))
    if what.startswith("loader-workers:"):
        text = what.removeprefix("loader-workers:")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{what!r}: loader-workers:N needs a whole N >= 1")
        return Optimization(
            what, workers=int(text), claims=("data.loader",), timer="wall",
            expectation=("the task lives in memory and a batch is one gather, so worker "
                         "processes only add inter-process copies; judged on wall time, "
                         "since the work moves to other processes"))
    if what == "compile":
        return Optimization(
            what, claims=("compile.eager", "compile.reference"), compiled=True,
            expectation=("Inductor fuses the pointwise work around the matrix products "
                         "(bias, GELU and their backward) into generated loops and keeps the "
                         "products on the same BLAS kernels, so the gain is bounded by the "
                         "non-matmul share of a step; the compile itself is paid once, on "
                         "the first call, and is reported apart"))
    raise ValueError(f"unknown optimization {what!r}; accepted: autocast-bf16, autocast-fp16, "
                     "recompute:SPEC (none|sqrt|uniform:K|optimal:S; for gpt also "
                     "selective or SPEC+selective), compile, loader-workers:N")


def _autocast_expectation(fmt: str) -> str:
    flags = _cpu_flags()
    units = {"bf16": ("amx_bf16", "avx512_bf16"), "fp16": ("amx_fp16", "avx512_fp16")}[fmt]
    have = [f for f in units if f in flags]
    if have:
        return f"this CPU has {', '.join(have)}: low-precision matmuls can be faster"
    return (f"this CPU has no {fmt} matmul units ({' or '.join(units)} absent from "
            f"/proc/cpuinfo): autocast adds casts and gains no arithmetic, expected slower")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
