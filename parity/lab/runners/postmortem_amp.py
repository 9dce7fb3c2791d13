"""The loss-scaling faults investigated: fp16 autocast without a GradScaler, and clipping
the gradients before scaler.unscale_. Each function runs the seeded loop and the repaired one
on a small model, measures what tells its hypotheses apart, and returns a Postmortem
(postmortem_record.py) whose verdicts are computed from those numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.lab.runners.postmortem_record import Hypothesis, Postmortem

FP16_MAX = float.fromhex("0x1.ffcp15")  # 65504 = (2 - 2^-10) * 2^15, float16's largest
UNDERFLOW_SCALE = 2.0**16  # the repair's loss scale (GradScaler's default init_scale)


# ---------------------------------------------------------------- fp16 without a GradScaler

def guard_no_underflow(zeros_fp16: dict[str, float], zeros_fp32: dict[str, float]) -> bool:
    """The regression guard: no parameter's gradient has more exact zeros in fp16 than the
    same gradient in float32 (an underflow to 0 is the only way to gain one)."""
    return all(zeros_fp16[name] <= zeros_fp32[name] for name in zeros_fp32)


def _grads(scale: float | None) -> tuple[dict[str, np.ndarray], list[float], int]:
    """One backward of scale * loss of the loss-scaling topic's small-init model (fp16
    autocast; None: float32, no autocast), unscaled: (name -> float64 grad, each Linear's
    largest |output| in the forward, the forward's non-finite values)."""
    import torch

    from parity.drivers.loss_scaling import underflow_batch, underflow_models

    _, tm = underflow_models()
    x, y = (torch.from_numpy(a) for a in underflow_batch())
    peaks: list[float] = []
    bad = 0

    def hook(_m: Any, _i: Any, out: torch.Tensor) -> None:
        nonlocal bad
        peaks.append(float(out.detach().abs().max()))
        bad += int((~torch.isfinite(out)).sum())

    handles = [m.register_forward_hook(hook) for m in tm]
    with torch.autocast("cpu", dtype=torch.float16, enabled=scale is not None):
        loss = torch.nn.functional.mse_loss(tm(x), y)
    for h in handles:
        h.remove()
    s = 1.0 if scale is None else scale
    (loss * torch.tensor(s, dtype=torch.float32)).backward()
    grads = {n: p.grad.numpy().astype(np.float64) / s for n, p in tm.named_parameters()}
    return grads, peaks, bad


def fp16_without_scaler() -> Postmortem:
    """fp16 autocast with the loss unscaled (S = 1) against S = 2^16 and float32."""
    seeded, peaks, bad = _grads(1.0)
    repaired, _, _ = _grads(UNDERFLOW_SCALE)
    fp32, _, _ = _grads(None)
    runs = {"fp16, S=1": seeded, "fp16, S=2^16": repaired, "fp32": fp32}
    zeros = {k: {n: float(np.mean(g == 0)) for n, g in run.items()} for k, run in runs.items()}
    error = {k: {n: float(np.linalg.norm(g - fp32[n]) / np.linalg.norm(fp32[n]))
                 for n, g in runs[k].items()} for k in ("fp16, S=1", "fp16, S=2^16")}
    names = list(fp32)
    table = [["", *names]]
    table += [[f"zeros, {k}", *(f"{v[n]:.1%}" for n in names)] for k, v in zeros.items()]
    table += [[f"error, {k}", *(f"{v[n]:.2%}" for n in names)] for k, v in error.items()]
    peak = max(peaks)
    lost = sum(zeros["fp16, S=1"][n] > zeros["fp32"][n] for n in names)
    healed = all(zeros["fp16, S=2^16"][n] <= zeros["fp32"][n] for n in names)
    worst = max(names, key=lambda n: error["fp16, S=1"][n])
    return Postmortem(
        "fp16_without_scaler", "float16 training without loss scaling",
        f"an fp16 autocast step of the small-init model (the loss-scaling topic's fault) "
        f"gives gradients far from the float32 step's: {worst} is off by "
        f"{error['fp16, S=1'][worst]:.1%}, and nothing is inf or NaN.",
        "per parameter, the share of gradient elements that are exactly 0 and the relative "
        "error against float32, with the loss scaled by S = 1 and by S = 2^16 (scaling moves "
        "the gradients away from float16's underflow threshold and changes nothing else); "
        "and the forward's largest |activation| and non-finite count under fp16 autocast.",
        table,
        [Hypothesis("backward underflow", "the backward's small gradients underflow float16 "
                    "(smallest subnormal 2^-24)",
                    f"{lost} of {len(names)} parameters gain exact zeros in fp16 at S = 1 "
                    f"(up to {max(zeros['fp16, S=1'].values()):.1%}); at S = 2^16 "
                    f"{'none does' if healed else 'some still do'}, and the error follows "
                    "the zeros", lost > 0 and healed),
         Hypothesis("forward overflow", f"the forward overflows float16 (max {FP16_MAX:g}) "
                    "and the loss is already wrong",
                    f"the largest |activation| is {peak:.4g}, {FP16_MAX / peak:.3g}x below "
                    f"float16's max, with {bad} non-finite values",
                    bad > 0 or peak >= FP16_MAX)],
        "scale the loss: `torch.amp.GradScaler` (`loss_scaling.make_scaler(\"fp16\")`, which "
        "`train_step` requires for fp16), or train in bf16.",
        "`postmortem_amp.guard_no_underflow`: no parameter's gradient has more exact zeros "
        "in fp16 than in float32",
        guard_no_underflow(zeros["fp16, S=1"], zeros["fp32"]),
        guard_no_underflow(zeros["fp16, S=2^16"], zeros["fp32"]),
        {"zeros": zeros, "error": error, "forward_max": peak, "forward_nonfinite": bad})


# ---------------------------------------------------------------- clip before unscale_

CLIP_STEPS = 4
CLIP_CONFIG = {"precision": "fp16", "max_grad_norm": 1.0, "optimizer": "SGD", "lr": 0.05,
               "schedule": "constant", "horizon": CLIP_STEPS}


def clip_loop(fault: str | None) -> dict[str, Any]:
    """CLIP_STEPS fp16 steps of the default MLP under a ScalerGuard, with train_step's
    `fault` ("clip_before_unscale": the clip runs on the scaled gradients; None: after
    unscale_): each step's clip norm, scale and skip, the parameters' total movement, and
    the guard's finding kinds."""
    import torch

    from parity.lab.your_trainer.scaler_guard import ScalerGuard
    from torch_impl.train import Run, TrainConfig

    run = Run(TrainConfig(**CLIP_CONFIG))
    run.step_fault = fault
    start = torch.cat([p.detach().flatten().clone() for p in run.model.parameters()])
    with ScalerGuard(run.scaler, run.optimizer, model=run.model) as guard:
        steps = [run.train_step() for _ in range(CLIP_STEPS)]
    end = torch.cat([p.detach().flatten() for p in run.model.parameters()])
    return {"clip_norm": [s.grad_norm for s in steps], "scale": [s.scale for s in steps],
            "skipped": sum(s.skipped for s in steps), "loss": [s.loss for s in steps],
            "moved": float(torch.linalg.vector_norm((end - start).double())),
            "findings": sorted({f.kind for f in guard.report()})}


def guard_clip_sees_unscaled(loop: dict[str, Any]) -> bool:
    """The regression guard: the ScalerGuard watching the loop found no clip on gradients
    still multiplied by the scale (kind clip_before_unscale)."""
    return "clip_before_unscale" not in loop["findings"]


def clip_before_unscale() -> Postmortem:
    """clip_grad_norm_ before scaler.unscale_ against after it, both at S = 2^16."""
    seeded, repaired = clip_loop("clip_before_unscale"), clip_loop(None)
    ratio = seeded["clip_norm"][0] / repaired["clip_norm"][0]  # the same weights and batch
    moved = seeded["moved"] / repaired["moved"]
    scale = seeded["scale"][0]
    table = [["loop", "norm the clip saw, step 0", "scale S", "skipped steps",
              "parameters moved (L2)", "ScalerGuard findings"]]
    for name, loop in (("seeded: clip, then unscale_", seeded),
                       ("repaired: unscale_, then clip", repaired)):
        table.append([name, f"{loop['clip_norm'][0]:.6g}", f"{loop['scale'][0]:g}",
                      str(loop["skipped"]), f"{loop['moved']:.4g}",
                      ", ".join(loop["findings"]) or "none"])
    return Postmortem(
        "clip_before_unscale", "gradients clipped before scaler.unscale_",
        f"an fp16 run with a GradScaler and max_grad_norm {CLIP_CONFIG['max_grad_norm']} "
        f"hardly learns: over {CLIP_STEPS} steps its parameters move {moved:.3g}x as far as "
        "the same run's with the clip after unscale_, and nothing is inf or NaN.",
        f"the same {CLIP_STEPS} fp16 steps (default MLP, SGD, S = {scale:g}) with the clip "
        "before and after scaler.unscale_, under "
        "parity.lab.your_trainer.scaler_guard.ScalerGuard: the "
        "norm clip_grad_norm_ returned at step 0 (the same weights and batch in both loops), "
        "the steps the scaler skipped, and how far the parameters moved.",
        table,
        [Hypothesis("clip on scaled gradients", "clip_grad_norm_ measures the gradients "
                    "still multiplied by S, so it clips at max_norm / S of the true norm",
                    f"the clip saw a norm {ratio:g}x the unscaled one (S = {scale:g}), and "
                    f"the seeded loop's parameters moved {moved:.3g}x as far",
                    ratio == scale and moved < 1),  # S = 2^k: the norm scales exactly
         Hypothesis("skipped steps", "the scaler skips the steps (inf/NaN gradients), so the "
                    "optimizer never updates",
                    f"the seeded loop skipped {seeded['skipped']} of {CLIP_STEPS} steps, and "
                    f"its parameters moved by {seeded['moved']:.3g} (not 0)",
                    seeded["skipped"] > 0 or seeded["moved"] == 0)],
        "unscale first: scaler.scale(loss).backward(); scaler.unscale_(optimizer); "
        "clip_grad_norm_(...); scaler.step(optimizer); scaler.update() (train_step's order).",
        "`postmortem_amp.guard_clip_sees_unscaled`: the ScalerGuard watching the loop reports "
        "no clip_before_unscale",
        guard_clip_sees_unscaled(seeded), guard_clip_sees_unscaled(repaired),
        {"seeded": seeded, "repaired": repaired, "norm_ratio": ratio, "moved_ratio": moved})
