"""An optimization through the whole gauntlet, against the eager float32 baseline.

    equivalence   the claims that state the optimization changes nothing it should not
                  (their quick checks, as `python -m parity report` runs them), plus the
                  optimized step's distance from the float32 step on one fixed batch
    timing        R repeats of K steps, baseline and optimized interleaved (ABBA), CPU time of
                  this process and wall time; median, IQR, and a bootstrap confidence interval
                  of the speedup ratio (median baseline / median optimized); each side's first
                  call timed apart (the compile, for torch.compile: parity/drivers/
                  optimize_timing.py, NOTE [ The first call is timed apart ])
    learning      both runs, same seed, the model's learning steps: the loss band and the
                  accuracy threshold, each passed or not
    resume        the optimized run interrupted mid-way (checkpoint written, every object
                  dropped, resumed from the file) against its uninterrupted twin: the complete
                  state bit for bit and the state digest

Only the torch tree is optimized (the reference is the spec the equivalence claims hold the
optimized kernels to). The model is the compact MLP or, with model="gpt", the compact
transformer of `train --model gpt` (torch_impl/gpt.py) on the copy task.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parity.drivers.optimize_timing import BOOTSTRAP, Timing, speedup, spread, time_interleaved
from parity.drivers.train import compare_runs, one_thread

__all__ = ["ACCURACY", "BASELINE", "BASELINES", "BOOTSTRAP", "CONTROLS", "LEARN_STEPS",
           "LOSS_BAND", "MODELS", "SUPPORTED", "Controls", "Gauntlet", "Learning",
           "Optimization", "Timing", "compiled_forward", "distance_from_fp32", "learn",
           "make_run", "parse", "resume_check", "run_gauntlet", "speedup", "spread",
           "time_interleaved"]

MODELS = ("mlp", "gpt")
# The baselines: a step is milliseconds of matmul, and the whole gauntlet runs in about a
# minute on 2 cores. The MLP learns the teacher task to ~0.89; the transformer is
# `train --model gpt`'s (reference/gpt_config.py TRAIN_SHAPE: 4 blocks, width 32, vocab 12,
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
    "mlp": Controls(300, 0.25, 0.80, "accuracy over the whole task (chance 0.1)"),
    # ln(12) = 2.48 at initialization; half the targets are the random digits, which no
    # model predicts (their floor is ln(11) / 2 = 1.20 per token averaged with the copied
    # half's 0), so the float32 baseline ends near 1.06 = 0.43 x the first loss and copies
    # every digit of the task
    "gpt": Controls(400, 0.50, 0.95, "copy accuracy: argmax at the 8 copied positions of "
                                     "every sequence of the task (chance 0.09)"),
}
LEARN_STEPS, LOSS_BAND, ACCURACY = (CONTROLS["mlp"].steps, CONTROLS["mlp"].loss_band,
                                    CONTROLS["mlp"].threshold)
RESUME_AT, RESUME_TOTAL = 7, 15
# what each model's gauntlet runs; anything else is a UsageError naming these
SUPPORTED = {"mlp": ("autocast-bf16", "autocast-fp16", "recompute:SPEC", "compile",
                     "loader-workers:N"),
             "gpt": ("autocast-bf16", "recompute:SPEC")}


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
                  "recompute": ("recompute.gpt_grads_torch", "recompute.gpt_held_bytes")}
        expectation = opt.expectation.replace("recompute.held_bytes", "recompute.gpt_held_bytes")
        opt = Optimization(opt.what, opt.changes, opt.workers, claims[head], opt.timer,
                           expectation, model, opt.compiled)
    if head == "recompute":
        _check_recompute(opt.changes["recompute"], model)
    return opt


def _check_recompute(spec: str, model: str) -> None:
    from reference.gpt_config import TRAIN_SHAPE
    from reference.recompute_plans import parse_schedule, split_recompute

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


# ---------------------------------------------------------------- runs


def make_run(opt: Optimization | None, model: str = "mlp", **overrides: Any) -> Any:
    """A torch training Run of `model`'s baseline (opt None), or of the optimized
    configuration (the model is then opt.model)."""
    from torch_impl import train as torch_train

    model = opt.model if opt is not None else model
    config = {**BASELINES[model], **(opt.changes if opt else {}), **overrides}
    run = torch_train.Run(torch_train.TrainConfig(**config))
    if opt is not None and opt.workers:
        with_workers(run, opt.workers)
    if opt is not None and opt.compiled:
        compiled_forward(run.model)
    return run


def compiled_forward(model: Any) -> Any:
    """The module's forward replaced, on this instance only, by torch.compile of it
    (Inductor, fullgraph: a graph break is an error, not a silent eager fallback).

    On the instance, not `torch.compile(model)`: the wrapper it returns prefixes every
    state_dict key with `_orig_mod.`, so its checkpoints would not load into the eager
    model; the instance keeps its keys, its parameters and its hooks, and train_step calls
    it as before. The loss (cross-entropy) stays eager; AOTAutograd compiles the forward's
    backward with it. (`Module.compile()`, which compiles `_call_impl`, finds no frame to
    compile under fullgraph in torch 2.13: the call machinery is on Dynamo's skip list.)
    A second instance of the same architecture passes the first one's guards and reuses its
    compiled code.
    """
    import torch

    model.forward = torch.compile(model.forward, backend="inductor", fullgraph=True)
    return model


@contextlib.contextmanager
def inductor_cache() -> Iterator[None]:
    """Inductor's on-disk caches in a fresh temporary directory, Dynamo's in-memory ones
    reset around it: the compile measured is cold, and nothing outlives the gauntlet.
    (Inductor writes the directory it settled on back into the environment: restored.)"""
    import torch

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="mirrortrain-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        try:
            yield
        finally:
            torch._dynamo.reset()
            if before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def with_workers(run: Any, workers: int) -> None:
    """Give a Run a DataLoader with worker processes over the same sampler and task.

    NOTE [ Workers run ahead of the sampler state ] (torch_impl/data.py): the sampler's
    state then counts what the workers took, not what was trained on; the resume check of
    the gauntlet is what shows whether that matters.
    """
    from torch.utils.data import BatchSampler, DataLoader

    batches = BatchSampler(run.sampler, run.config.batch_size, drop_last=True)
    run.loader = DataLoader(run.task, batch_sampler=batches, num_workers=workers,
                            generator=run.loader_generator, persistent_workers=False)
    run._batches = None


@dataclass
class Learning:
    initial_loss: float
    final_loss: float  # mean over the last 10 steps
    accuracy: float
    loss_band: float = LOSS_BAND  # the model's Controls
    threshold: float = ACCURACY
    steps: int = LEARN_STEPS

    @property
    def in_band(self) -> bool:
        return self.final_loss <= self.loss_band * self.initial_loss

    @property
    def accurate(self) -> bool:
        return self.accuracy >= self.threshold


def learn(opt: Optimization | None, steps: int | None = None, model: str = "mlp"
          ) -> Learning:
    """`steps` (default: the model's Controls) steps from the seed; the loss curve's ends
    and the accuracy the model's Controls measure."""
    import torch

    run = make_run(opt, model)
    controls = CONTROLS[run.config.model]
    steps = steps or controls.steps
    losses = [run.train_step().loss for _ in range(steps)]
    run.model.eval()
    with torch.no_grad():
        if run.config.model == "gpt":
            from reference.gpt_config import TRAIN_COPY_PREFIX as copied  # plain data

            logits = run.model(run.task.inputs)[0]  # (n, T, V)
            hits = logits[:, copied:].argmax(-1) == run.task.labels[:, copied:]
        else:
            hits = run.model(run.task.inputs).argmax(-1) == run.task.labels
    return Learning(losses[0], float(np.mean(losses[-10:])), float(hits.double().mean()),
                    controls.loss_band, controls.threshold, steps)


def distance_from_fp32(opt: Optimization) -> dict[str, float]:
    """One step's loss and gradients, optimized vs the float32 eager step, same weights and
    batch: max |difference| / max |float32 value| (informative, not a claim: the claims say
    what the difference may be), and "bitwise" 1.0 when every value is equal."""
    from torch_impl import train as torch_train

    base, other = make_run(None, opt.model), make_run(opt)
    x, y = base.next_batch()
    out = {}
    for name, run in (("fp32", base), ("optimized", other)):
        r = torch_train.train_step(run.model, run.loss_fn, frozen_optimizer(run), run.scaler,
                                   x, y, precision=run.config.precision, schedule=run.schedule)
        out[name] = (r.loss, [p.grad.detach().double().clone() for p in run.model.parameters()])
    (loss_a, grads_a), (loss_b, grads_b) = out["fp32"], out["optimized"]
    worst = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))
                for a, b in zip(grads_a, grads_b, strict=True))
    bitwise = loss_a == loss_b and all(bool((a == b).all())
                                       for a, b in zip(grads_a, grads_b, strict=True))
    return {"loss": abs(loss_a - loss_b) / abs(loss_a), "gradients": worst,
            "bitwise": float(bitwise)}


def frozen_optimizer(run: Any) -> Any:
    """An optimizer whose step changes nothing (lr 0 SGD), so the gradients stay to be read."""
    import torch

    return torch.optim.SGD(run.model.parameters(), lr=0.0)


def resume_check(opt: Optimization) -> tuple[float, int, bool]:
    """(mismatching values, values compared, digests equal): the optimized run interrupted at
    RESUME_AT of RESUME_TOTAL steps and resumed from its checkpoint file, against the same
    run uninterrupted."""
    from torch_impl import resume
    from torch_impl import train as torch_train

    def advance(run: Any, to: int) -> Any:
        while run.step < to:
            run.train_step()
        return run

    whole = advance(make_run(opt), RESUME_TOTAL).state_dict()
    with tempfile.TemporaryDirectory(prefix="mirrortrain-optimize-") as tmp:
        path = Path(tmp) / "interrupted.ckpt"
        first = advance(make_run(opt), RESUME_AT)
        resume.save_checkpoint(path, first.state_dict(), first.config.to_dict())
        del first
        again = make_run(opt)
        again.load_state_dict(resume.load_checkpoint(path))
        resumed = advance(again, RESUME_TOTAL).state_dict()
    mismatches, n = compare_runs(resumed, whole)
    same = torch_train.state_digest(resumed) == torch_train.state_digest(whole)
    return mismatches, n, same


@dataclass
class Gauntlet:
    opt: Optimization
    claims: list[tuple[str, float, str, bool]]  # id, observed, bound text, holds
    distance: dict[str, float]
    timing: Timing
    speedup: tuple[float, float, float]
    learning: dict[str, Learning]
    resume: tuple[float, int, bool]
    seconds: float = 0.0

    @property
    def null(self) -> bool:
        """The speedup's confidence interval contains 1: no measurable effect either way."""
        return self.speedup[1] <= 1.0 <= self.speedup[2]

    @property
    def passed(self) -> bool:
        return (all(h for *_, h in self.claims) and all(
            learn.in_band and learn.accurate for learn in self.learning.values())
            and self.resume[0] == 0 and self.resume[2])


def run_gauntlet(opt: Optimization, repeats: int, steps: int,
                 progress: Callable[[str], None] = lambda _: None,
                 learn_steps: int | None = None) -> Gauntlet:
    from parity.compare import holds
    from parity.report import CHECKS, load_checks
    from parity.tolerances import claim

    start = time.perf_counter()
    cache = inductor_cache() if opt.compiled else contextlib.nullcontext()
    with one_thread(), cache:
        progress(f"timing: {repeats} repeats x {steps} steps per side")
        if opt.compiled:  # the first call compiles from nothing (NOTE in optimize_timing)
            import torch

            torch._dynamo.reset()
        runs = {"baseline": make_run(None, opt.model), "optimized": make_run(opt)}
        timing = time_interleaved(runs, repeats, steps)
        del runs
        ratio = speedup(*timing.samples(opt.timer))
        load_checks()  # after the timing: a claim's check may compile (warm caches)
        claims = []
        for cid in opt.claims:
            progress(f"claim {cid}")
            c, obs = claim(cid), CHECKS[cid]()
            claims.append((cid, obs.observed, c.tolerance, holds(c, obs.observed)))
        progress("distance from float32")
        distance = distance_from_fp32(opt)
        progress("learning controls")
        learning = {"baseline": learn(None, learn_steps, opt.model),
                    "optimized": learn(opt, learn_steps)}
        progress("resume")
        resumed = resume_check(opt)
    return Gauntlet(opt, claims, distance, timing, ratio, learning, resumed,
                    time.perf_counter() - start)
