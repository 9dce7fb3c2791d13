"""The numerics Detector in a user's own loop with gradient accumulation (common/
numerics_detect.py: micro_step, end_step): four micro-steps a step, fp16 autocast and a
GradScaler, clip_grad_norm_. Each fault is seeded in one micro-step, and the report names
that micro-step (counted from 0, the `micro` of `for micro in range(4)`); a clean run
reports nothing and its counts, micro-step by micro-step, are the counts of a second model
run apart, each micro-step from zeroed gradients, counted here with torch's own cast."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from torch_impl.numerics import Detector, FirstInvalid, NonFinite

MICRO = 4  # micro-steps a step
BOOST = 1e6  # the loss of a micro-step times this: the scaled gradient overflows float16
ROOT = Path(__file__).resolve().parent.parent


def _model(device: str) -> tuple[nn.Module, torch.Tensor]:
    """Linear -> ReLU -> Linear (the ReLU's zeros give the counts something to count), and
    (steps, MICRO, batch, 8) inputs."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model, torch.randn(2, MICRO, 6, 8, generator=g).to(device)


class _InfGrad(torch.autograd.Function):
    """The identity, whose backward puts +inf at the output gradient's element (0, 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        g = g.clone()
        g[0, 0] = float("inf")
        return g


def _step(model: nn.Module, detector: Detector, xs: torch.Tensor,
          optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, *,
          boost_at: int | None = None, inf_grad_at: int | None = None,
          nan_at: int | None = None, device: str = "cpu") -> FirstInvalid | None:
    """One step of a user's loop: MICRO micro-steps (fp16 autocast when there is a scaler),
    unscale_, clip_grad_norm_, end_step, the update. A fault in micro-step `boost_at` (the
    loss times BOOST), `inf_grad_at` (an inf output gradient) or `nan_at` (a NaN input)."""
    for micro in range(MICRO):
        x = xs[micro].clone()
        if micro == nan_at:
            x[0, 0] = float("nan")
        with detector.micro_step():
            with torch.autocast(device, torch.float16, enabled=scaler is not None):
                out = model(x)
            if micro == inf_grad_at:
                out = _InfGrad.apply(out)
            loss = out.float().pow(2).mean() / MICRO * (BOOST if micro == boost_at else 1.0)
        (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    found = detector.end_step(scaler=scaler, grad_norm=norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return found


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_an_overflow_in_micro_step_1_of_4_is_named_and_the_scaler_skips_the_step(
        device: str) -> None:
    """Micro-step 1's loss times 1e6: its forward is finite, its scaled gradient overflows
    float16 in the backward. end_step returns the report (not raised): step 0, micro-step
    1 of 4, backward; the scaler does skip the step (weights unchanged, scale halved)."""
    model, xs = _model(device)
    detector = Detector(model, None, "float16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    before = _weights(model)
    found = _step(model, detector, xs[0], optimizer, scaler, boost_at=1, device=device)
    assert found is not None and detector.skipped == [found]
    assert (found.step, found.micro_step, found.micro_steps, found.phase, found.skipped,
            found.scale) == (0, 1, MICRO, "backward", True, 2.0 ** 16)
    assert "micro-step 1 of 4" in found.describe() and "skips this step" in found.describe()
    assert scaler.get_scale() == 2.0 ** 15  # the scaler saw the same overflow
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    forward, grads = (sum(sum(row[:3]) for name, row in detector.micro_counts[1].items()
                          if name.startswith(kind)) for kind in ("act:", "grad:"))
    assert forward == 0 and grads > 0  # made in the backward, seen in micro-step 1 only
    assert [sum(sum(r[:3]) for r in c.values()) > 0 for c in detector.micro_counts] == [
        False, True, False, False]
    assert _step(model, detector, xs[1], optimizer, scaler, device=device) is None


def test_a_nan_in_micro_step_3_without_a_scaler_raises_before_the_update(device: str
                                                                        ) -> None:
    """A NaN in micro-step 3's input, no scaler: end_step raises NonFinite naming step 0,
    micro-step 3 of 4, forward, the first Linear; the optimizer has not stepped."""
    model, xs = _model(device)
    detector = Detector(model, None, "float16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _weights(model)
    with pytest.raises(NonFinite) as e:
        _step(model, detector, xs[0], optimizer, None, nan_at=3, device=device)
    r = e.value.report
    assert (r.step, r.micro_step, r.micro_steps, r.phase, r.module, r.op, r.value) == (
        0, 3, MICRO, "forward", "0", "AddmmBackward0", "nan")
    assert "step 0, micro-step 3 of 4, forward" in str(e.value)
    assert [r.name for r in r.inputs if r.nonfinite] == ["input"]
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_clipping_does_not_hide_an_inf_gradient_of_the_last_micro_step(device: str) -> None:
    """+inf in micro-step 3's output gradient (the last: counted after the clip ran): the
    clip's inf norm multiplies .grad by 0 (the inf becomes NaN), but the report names the
    increment's +inf in micro-step 3, backward, at 2.bias (first in backward order), and the
    pre-clip norm as not finite (NaN: the weight's gradient holds inf * 0)."""
    model, xs = _model(device)
    detector = Detector(model, None, "float16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _weights(model)
    with pytest.raises(NonFinite) as e:
        _step(model, detector, xs[0], optimizer, None, inf_grad_at=3, device=device)
    r = e.value.report
    assert (r.micro_step, r.phase, r.module, r.value) == (3, "backward", "2.bias", "inf")
    assert r.grad_norm is not None and not math.isfinite(r.grad_norm)
    assert detector.micro_counts[3]["grad:2.bias"][:3] == [0, 1, 0]
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert torch.isnan(model[2].bias.grad).any()  # what counting after the clip would see


def test_a_sum_of_finite_increments_that_overflows_is_named_by_the_pre_clip_norm(
        device: str) -> None:
    """w x with x = 1 and a loss of 2^127 w: each micro-step adds 2^127 to w's gradient,
    finite; the second makes .grad 2^128, past float32 (inf). No increment has a non-finite
    value; the pre-clip norm does, and end_step raises naming it at micro-step 1 of 2."""
    model = nn.Linear(1, 1, bias=False).to(device)
    detector = Detector(model, None, "float32")
    for _ in range(2):
        with detector.micro_step():
            loss = model(torch.ones(1, 1, device=device)).sum() * 2.0 ** 127
        loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    with pytest.raises(NonFinite) as e:
        detector.end_step(grad_norm=norm)
    r = e.value.report
    assert len(detector.micro_counts) == 2 and all(  # every increment finite
        sum(row[:3]) == 0 for counts in detector.micro_counts for row in counts.values())
    assert (r.micro_step, r.micro_steps, r.phase, r.module, r.value) == (
        1, 2, "backward", "grad_norm", "inf")


# NOTE: the oracle below casts with torch's own .to(float16); the detector counts on bits.
def _row(x: torch.Tensor) -> list[int]:
    """(nan, +inf, -inf, zero, over_max, to_zero) of x viewed in float16, by the cast."""
    x = x.detach().float()
    h = x.to(torch.float16)
    finite = torch.isfinite(x)
    cols = (torch.isnan(x), torch.isposinf(x), torch.isneginf(x), x == 0,
            finite & torch.isinf(h), finite & (x != 0) & (h == 0))
    return [int(c.sum()) for c in cols]


def test_an_ordinary_run_reports_nothing_and_counts_each_micro_step_apart(device: str
                                                                          ) -> None:
    """Two clean steps (fp16 autocast, GradScaler, clip): nothing found, nothing skipped;
    each micro-step's rows equal the rows of a copy of the model run on the same input from
    zeroed gradients (its outputs and its .grad: that micro-step's increment), counted here."""
    model, xs = _model(device)
    detector = Detector(model, None, "float16")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    for step in range(2):
        twin = copy.deepcopy(model)  # the step's weights, before its update
        scale = scaler.get_scale()
        assert _step(model, detector, xs[step], optimizer, scaler, device=device) is None
        for micro in range(MICRO):
            outputs: dict[str, torch.Tensor] = {}
            hooks = [m.register_forward_hook(lambda m, a, out, n=n, kept=outputs:
                                             kept.update({n: out}))
                     for n, m in twin.named_children()]
            twin.zero_grad(set_to_none=True)
            with torch.autocast(device, torch.float16):
                out = twin(xs[step, micro])
            (out.float().pow(2).mean() / MICRO * scale).backward()
            for h in hooks:
                h.remove()
            apart = {**{f"act:{n}": _row(o) for n, o in outputs.items()},
                     **{f"grad:{n}": _row(p.grad) for n, p in twin.named_parameters()}}
            assert detector.micro_counts[micro] == apart, (step, micro)
    assert detector.skipped == [] and len(detector.history) == 2
    assert any(row[3] for row in detector.micro_counts[0].values())  # a count that is not 0


# ---------------------------------------------------------------- the reference's twin
def test_the_reference_detector_names_an_inf_gradient_in_micro_step_1() -> None:
    """The reference's micro_step on its MLP: +inf in micro-step 1's output gradient is named
    at micro-step 1 of 3, backward, 2.bias; each micro-step's gradient rows are the counts
    (numpy, in float64) of a copy's .grad after that micro-step alone."""
    from reference import numerics as r_numerics
    from reference.nn import CrossEntropyLoss, make_mlp

    model, loss_fn = make_mlp((8, 16, 3), "tanh", rng=np.random.default_rng(0)), CrossEntropyLoss()
    twin = copy.deepcopy(model)
    rng = np.random.default_rng(1)
    xs, y = rng.standard_normal((3, 4, 8)).astype(np.float32), np.array([0, 1, 2, 0])
    detector = r_numerics.Detector(model, loss_fn, "float16")

    def backward(m: Any, g: np.ndarray, micro: int) -> None:
        if micro == 1:
            g = g.copy()
            g[0, 0] = np.inf
        with np.errstate(over="ignore", invalid="ignore"):  # the inf is meant
            m.backward(g)

    for micro in range(3):
        with detector.micro_step():
            loss_fn(model(xs[micro]), y)
        backward(model, loss_fn.backward(1.0), micro)
    with pytest.raises(r_numerics.NonFinite) as e:
        detector.end_step()
    r = e.value.report
    assert (r.micro_step, r.micro_steps, r.phase, r.module) == (1, 3, "backward", "2.bias")
    for micro in range(3):
        twin.zero_grad()
        loss_fn(twin(xs[micro]), y)
        backward(twin, loss_fn.backward(1.0), micro)
        for name, p in twin.named_parameters():
            g = p.grad.astype(np.float64)
            assert detector.micro_counts[micro][f"grad:{name}"][:4] == [
                int(np.isnan(g).sum()), int(np.isposinf(g).sum()), int(np.isneginf(g).sum()),
                int((g == 0).sum())], (micro, name)


# ---------------------------------------------------------------- the docs' snippet
def test_the_accumulation_snippet_in_docs_your_trainer_runs(capsys: pytest.CaptureFixture
                                                            ) -> None:
    """docs/your-trainer.md's loop with accumulation, GradScaler and clipping, run as shown:
    its seeded overflow in micro-step 1 is the one skipped step, and it prints the text the
    page shows under it."""
    page = (ROOT / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(\w*)\n(.*?)```", page, re.S)  # (language, text), in order
    i = next(i for i, (lang, text) in enumerate(blocks)
             if lang == "python" and "micro_step" in text)
    (_, code), (lang, shown) = blocks[i], blocks[i + 1]
    assert lang == "text"
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/your-trainer.md", "exec"), scope)
    skipped = scope["detector"].skipped
    assert [(r.step, r.micro_step, r.phase) for r in skipped] == [(1, 1, "backward")]
    assert capsys.readouterr().out == shown
