"""The faults the mini-project investigates, by name: `python -m parity miniproject --fault
NAME` writes one postmortem, `--all-faults` every one. Each entry says in a line what its
postmortem shows (docs/miniproject.md's table is generated from these lines) and names the
function that runs it: the seeded loop and the repaired one on a small model, the
discriminating measurement, the verdicts computed from the numbers, and the regression
guard run on both loops (postmortem_amp.py, postmortem_loop.py; the record and the rubric's
grade are postmortem_record.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parity.lab.runners import postmortem_amp as amp
from parity.lab.runners import postmortem_loop as loop
from parity.lab.runners.postmortem_record import Postmortem


@dataclass(frozen=True)
class Fault:
    """One fault of the course: its name, a line each for the docs' table, and the
    investigation that measures it."""

    name: str
    symptom: str
    measurement: str
    rejected: str  # the hypothesis the measurement is there to rule out
    repair: str
    guard: str
    investigate: Callable[[], Postmortem]


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("fp16_without_scaler",
          "fp16 gradients far from float32's, nothing inf or NaN",
          "exact zeros per parameter at S = 1 and S = 2^16 against float32; the forward's "
          "largest activation",
          "the forward overflows float16", "a GradScaler (or bf16)",
          "`guard_no_underflow`: no gradient has more zeros in fp16 than in float32",
          amp.fp16_without_scaler),
    Fault("clip_before_unscale",
          "an fp16 run with clipping hardly moves its parameters",
          "the norm clip_grad_norm_ saw, the skipped steps and the parameters' movement, clip "
          "before and after unscale_, under a ScalerGuard",
          "the scaler skips the steps", "unscale_, then clip",
          "`guard_clip_sees_unscaled`: the ScalerGuard reports no clip_before_unscale",
          amp.clip_before_unscale),
    Fault("item_in_step",
          "the forward's time does not match its kernels (on CUDA the host waits there)",
          "host reads (aten._local_scalar_dense) and aten ops per phase, with and without "
          "the debug read",
          "the wait is the loop's own end-of-step loss.item()",
          "read after the step, or once per log interval",
          "`guard_no_early_read`: no host read in the forward or backward",
          loop.item_in_step),
    Fault("graph_break",
          "a compiled forward runs as two graphs with Python between them",
          "torch._dynamo.explain (graphs, breaks, reasons); graphs and failed guards over "
          "repeated calls",
          "it recompiles on every call", "`torch.where` instead of `if tensor:`",
          "`guard_one_graph`: one graph, no break",
          loop.graph_break),
    Fault("incomplete_checkpoint",
          "a resumed run drifts from the uninterrupted one; the checkpoint loads fine",
          "each candidate entry (scaler, rng, data) compared bit for bit right after the "
          "resume; the inventory the file lacks",
          "the RNG or the sampler position was lost", "save and restore the whole inventory",
          "`guard_exact_resume`: the resumed digest is the uninterrupted one",
          loop.incomplete_checkpoint),
)}

DEFAULT = "fp16_without_scaler"  # the mini-project's fault before there were five


def fault_named(name: str) -> Fault:
    """FAULTS[name], or a ValueError listing the names."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; the mini-project's faults: "
                         f"{', '.join(FAULTS)}")
    return FAULTS[name]


def investigate(name: str = DEFAULT) -> Postmortem:
    """Run fault `name`'s investigation (real runs, a few steps each) and return it."""
    pm = fault_named(name).investigate()
    if pm.fault != name:
        raise RuntimeError(f"the investigation of {name} reported fault {pm.fault}")
    return pm
