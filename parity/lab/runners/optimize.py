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
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parity.drivers.train import compare_runs, one_thread
from parity.lab.runners.optimize_spec import (
    ACCURACY,
    BASELINE,
    BASELINES,
    CONTROLS,
    LEARN_STEPS,
    LOSS_BAND,
    MODELS,
    RESUME_AT,
    RESUME_TOTAL,
    SUPPORTED,
    Controls,
    Optimization,
    parse,
)
from parity.lab.runners.optimize_timing import (
    BOOTSTRAP,
    CONFIDENCE,
    Timing,
    speedup,
    spread,
    time_interleaved,
)

__all__ = ["ACCURACY", "BASELINE", "BASELINES", "BOOTSTRAP", "CONFIDENCE", "CONTROLS",
           "LEARN_STEPS", "LOSS_BAND", "MODELS", "RESUME_AT", "RESUME_TOTAL", "SUPPORTED",
           "Controls", "Gauntlet", "Learning", "Optimization", "Timing", "compiled_forward",
           "distance_from_fp32", "equivalence", "learn", "make_run", "parse", "resume_check",
           "run_gauntlet", "speedup", "spread", "time_interleaved"]

# ---------------------------------------------------------------- runs


def make_run(opt: Optimization | None, model: str = "mlp", **overrides: Any) -> Any:
    """A torch training Run of `model`'s baseline (opt None), or of the optimized
    configuration (the model is then opt.model)."""
    from torch_impl import train as torch_train

    model = opt.model if opt is not None else model
    config = {**BASELINES[model], **(opt.changes if opt else {}), **overrides}
    workers = opt.workers if opt is not None else 0
    run = torch_train.Run(torch_train.TrainConfig(**config), loader_workers=workers)
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

    from torch_impl.gpt import GPT

    if isinstance(model, GPT):  # the token check an assertion in the graph (torch_impl/compile.py)
        from torch_impl.compile import compile_gpt_forward

        return compile_gpt_forward(model, backend="inductor")
    model.forward = torch.compile(model.forward, backend="inductor", fullgraph=True)
    return model


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
            from common.gpt_config import TRAIN_COPY_PREFIX as copied  # plain data

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


def compiled_equivalence(opt: Optimization) -> tuple[str, float, str, bool]:
    """compile.eager held on the gauntlet's own compiled model (not only the claim's small
    case): the eager baseline and the optimized run (equal weights) on the first batch."""
    from parity.compare import holds
    from parity.drivers import compile as dc
    from parity.tolerances import claim

    base, other = make_run(None, opt.model), make_run(opt)
    x, y = base.next_batch()
    if opt.model == "gpt":
        from parity.drivers import compile_gpt as cg

        worst, _ = cg.held_to_eager(base.model, other.model, base.loss_fn, x.numpy(),
                                    y.numpy())
        c = claim("compile.gpt_eager")
        return (f"compile.gpt_eager (this transformer, batch {tuple(x.shape)})", worst,
                c.tolerance, holds(c, worst))
    case = dc.Case(tuple(base.config.sizes), base.config.activation, len(x))
    worst, _ = dc.held_to_eager(base.model, other.model, case, x.numpy(), y.numpy())
    c = claim("compile.eager")
    return (f"compile.eager (the {case.activation} MLP {case.sizes}, batch {case.batch})",
            worst, c.tolerance, holds(c, worst))


def equivalence(opt: Optimization, progress: Callable[[str], None] = lambda _: None
                ) -> list[tuple[str, float, str, bool]]:
    """The optimization's claims as the report checks them, then, for a compiled model,
    compiled_equivalence on the gauntlet's own model: (id, observed, bound text, holds)."""
    from parity.lab import report

    progress(f"claims {', '.join(opt.claims)}: their topics' parity tests")
    claims = [(r.claim.id, float("nan") if r.observation is None else r.observation.observed,
               r.claim.tolerance, r.verdict == "ok")
              for r in report.run(only=opt.claims).rows]
    if opt.compiled:
        progress("compile.eager on this model")
        claims.append(compiled_equivalence(opt))
    return claims


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
    start = time.perf_counter()
    cache = contextlib.nullcontext()
    if opt.compiled:
        from parity.drivers.compile import fresh_inductor_cache

        cache = fresh_inductor_cache()
    with one_thread(), cache:
        progress(f"timing: {repeats} repeats x {steps} steps per side")
        if opt.compiled:  # the first call compiles from nothing (NOTE in optimize_timing)
            import torch

            torch._dynamo.reset()
        runs = {"baseline": make_run(None, opt.model), "optimized": make_run(opt)}
        timing = time_interleaved(runs, repeats, steps)
        del runs
        ratio = speedup(*timing.samples(opt.timer))
        # after the timing: a claim's tests may compile (warm caches)
        claims = equivalence(opt, progress)
        progress("distance from float32")
        distance = distance_from_fp32(opt)
        progress("learning controls")
        learning = {"baseline": learn(None, learn_steps, opt.model),
                    "optimized": learn(opt, learn_steps)}
        progress("resume")
        resumed = resume_check(opt)
    return Gauntlet(opt, claims, distance, timing, ratio, learning, resumed,
                    time.perf_counter() - start)
