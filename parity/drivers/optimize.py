"""An optimization through the whole gauntlet, against the eager float32 baseline.

    equivalence   the claims that state the optimization changes nothing it should not
                  (their quick checks, as `python -m parity report` runs them), plus the
                  optimized step's distance from the float32 step on one fixed batch
    timing        R repeats of K steps, baseline and optimized interleaved (ABBA), CPU time of
                  this process and wall time; median, IQR, and a bootstrap confidence interval
                  of the speedup ratio (median baseline / median optimized)
    learning      both runs, same seed, LEARN_STEPS steps: the loss band and the accuracy
                  threshold, each passed or not
    resume        the optimized run interrupted mid-way (checkpoint written, every object
                  dropped, resumed from the file) against its uninterrupted twin: the complete
                  state bit for bit and the state digest

Only the torch tree is optimized (the reference is the spec the equivalence claims hold the
optimized kernels to); the compact MLP is the model.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parity.drivers.train import compare_runs, one_thread

# The baseline: big enough that a step is milliseconds of matmul, small enough that the
# whole gauntlet runs in about a minute on 2 cores. Learns the teacher task to ~0.89.
BASELINE: dict[str, Any] = {"sizes": (32, 256, 256, 10), "activation": "gelu",
                            "batch_size": 64, "num_samples": 2048, "lr": 3e-3,
                            "horizon": 300, "precision": "fp32", "recompute": "none"}
LEARN_STEPS = 300
# The learning controls, stated once: over the last 10 of LEARN_STEPS steps the mean loss is
# at most LOSS_BAND of the loss at initialization (ln(10) = 2.30 for 10 balanced classes),
# and the accuracy over the whole task is at least ACCURACY (chance: 0.1). The float32
# baseline reaches 0.36 / 2.30 = 0.16 and 0.886.
LOSS_BAND = 0.25
ACCURACY = 0.80
BOOTSTRAP = 2000
RESUME_AT, RESUME_TOTAL = 7, 15


@dataclass(frozen=True)
class Optimization:
    """What `--what` names: the config fields it changes and what is known about it."""

    what: str
    changes: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    claims: tuple[str, ...] = ()  # the claims that state its equivalence
    timer: str = "cpu"  # which clock decides: "cpu" (this process) or "wall"
    expectation: str = ""  # what the mechanism predicts, so a null result has its cause


def parse(what: str) -> Optimization:
    """An Optimization from its spec; ValueError listing the accepted ones."""
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
        raise ValueError("compile: torch.compile is not wired into the gauntlet in this "
                         "version (see docs/optimize.md)")
    raise ValueError(f"unknown optimization {what!r}; accepted: autocast-bf16, autocast-fp16, "
                     "recompute:SPEC (none|sqrt|uniform:K|optimal:S), loader-workers:N")


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


def make_run(opt: Optimization | None, **overrides: Any) -> Any:
    """A torch training Run of the baseline, or of the optimized configuration."""
    from torch_impl import train as torch_train

    config = {**BASELINE, **(opt.changes if opt else {}), **overrides}
    run = torch_train.Run(torch_train.TrainConfig(**config))
    if opt is not None and opt.workers:
        with_workers(run, opt.workers)
    return run


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
class Timing:
    baseline_cpu: list[float]
    optimized_cpu: list[float]
    baseline_wall: list[float]
    optimized_wall: list[float]
    steps: int

    def samples(self, timer: str) -> tuple[np.ndarray, np.ndarray]:
        if timer == "cpu":
            return np.array(self.baseline_cpu), np.array(self.optimized_cpu)
        return np.array(self.baseline_wall), np.array(self.optimized_wall)


def time_interleaved(opt: Optimization, repeats: int, steps: int) -> Timing:
    """R repeats of `steps` steps per side, ABBA-interleaved after one warm-up block each.
    Seconds per step, CPU time of this process (time.process_time) and wall time."""
    runs = {"baseline": make_run(None), "optimized": make_run(opt)}
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in runs}

    def block(name: str, record: bool) -> None:
        run = runs[name]
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            run.train_step()
        c1, w1 = time.process_time(), time.perf_counter()
        if record:
            out[name][0].append((c1 - c0) / steps)
            out[name][1].append((w1 - w0) / steps)

    for name in runs:
        block(name, record=False)
    for r in range(repeats):
        order = ("baseline", "optimized") if r % 2 == 0 else ("optimized", "baseline")
        for name in order:
            block(name, record=True)
    return Timing(out["baseline"][0], out["optimized"][0], out["baseline"][1],
                  out["optimized"][1], steps)


def speedup(baseline: np.ndarray, optimized: np.ndarray, seed: int = 0
            ) -> tuple[float, float, float]:
    """(ratio of medians baseline/optimized, 2.5th and 97.5th percentile of its bootstrap
    distribution): each side resampled with replacement, BOOTSTRAP times, seeded."""
    rng = np.random.default_rng(seed)
    b = rng.choice(baseline, (BOOTSTRAP, baseline.size))
    o = rng.choice(optimized, (BOOTSTRAP, optimized.size))
    ratios = np.median(b, axis=1) / np.median(o, axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(np.median(baseline) / np.median(optimized)), float(low), float(high)


def spread(x: np.ndarray) -> tuple[float, float, float]:
    """(median, 25th, 75th percentile)."""
    q25, q50, q75 = np.percentile(x, [25, 50, 75])
    return float(q50), float(q25), float(q75)


@dataclass
class Learning:
    initial_loss: float
    final_loss: float  # mean over the last 10 steps
    accuracy: float

    @property
    def in_band(self) -> bool:
        return self.final_loss <= LOSS_BAND * self.initial_loss

    @property
    def accurate(self) -> bool:
        return self.accuracy >= ACCURACY


def learn(opt: Optimization | None, steps: int = LEARN_STEPS) -> Learning:
    """`steps` steps from the seed; the loss curve's ends and the task accuracy."""
    import torch

    run = make_run(opt)
    losses = [run.train_step().loss for _ in range(steps)]
    run.model.eval()
    with torch.no_grad():
        predicted = run.model(run.task.inputs).argmax(-1)
    accuracy = float((predicted == run.task.labels).double().mean())
    return Learning(losses[0], float(np.mean(losses[-10:])), accuracy)


def distance_from_fp32(opt: Optimization) -> dict[str, float]:
    """One step's loss and gradients, optimized vs the float32 eager step, same weights and
    batch: max |difference| / max |float32 value| (informative, not a claim: the claims say
    what the difference may be)."""
    from torch_impl import train as torch_train

    base, other = make_run(None), make_run(opt)
    x, y = base.next_batch()
    out = {}
    for name, run in (("fp32", base), ("optimized", other)):
        r = torch_train.train_step(run.model, run.loss_fn, frozen_optimizer(run), run.scaler,
                                   x, y, precision=run.config.precision, schedule=run.schedule)
        out[name] = (r.loss, [p.grad.detach().double().clone() for p in run.model.parameters()])
    (loss_a, grads_a), (loss_b, grads_b) = out["fp32"], out["optimized"]
    worst = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-300))
                for a, b in zip(grads_a, grads_b, strict=True))
    return {"loss": abs(loss_a - loss_b) / abs(loss_a), "gradients": worst}


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
                 learn_steps: int = LEARN_STEPS) -> Gauntlet:
    from parity.compare import holds
    from parity.report import CHECKS, load_checks
    from parity.tolerances import claim

    start = time.perf_counter()
    with one_thread():
        load_checks()
        claims = []
        for cid in opt.claims:
            progress(f"claim {cid}")
            c, obs = claim(cid), CHECKS[cid]()
            claims.append((cid, obs.observed, c.tolerance, holds(c, obs.observed)))
        progress("distance from float32")
        distance = distance_from_fp32(opt)
        progress(f"timing: {repeats} repeats x {steps} steps per side")
        timing = time_interleaved(opt, repeats, steps)
        ratio = speedup(*timing.samples(opt.timer))
        progress("learning controls")
        learning = {"baseline": learn(None, learn_steps), "optimized": learn(opt, learn_steps)}
        progress("resume")
        resumed = resume_check(opt)
    return Gauntlet(opt, claims, distance, timing, ratio, learning, resumed,
                    time.perf_counter() - start)
