"""parity.lab.your_trainer.scaler_guard on a user's loop: each misuse seeded one at a time into one
realistic loop (an MLP, AdamW, autocast, GradScaler) is reported as exactly that finding, at
the loop's line; correct loops, and the project's own training step, report nothing.

A line is named by the `# [tag]` comment that ends it, so the expected file:line is read
from this file, not typed in.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_  # bound before any guard starts: still seen

from common.train_config import TrainConfig
from parity.lab.your_trainer import scaler_guard_probes as probes
from parity.lab.your_trainer.scaler_guard import ScalerGuard, ScalerMisuse
from torch_impl import train as ttrain
from torch_impl.loss_scaling import make_scaler

FP16, BF16 = torch.float16, torch.bfloat16


def line_of(path: str | Path, text: str) -> str:
    """path:line of the one line of `path` that ends with `text` (or holds it, for code)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    hits = [i for i, s in enumerate(lines, 1) if s.rstrip().endswith(text)] or \
           [i for i, s in enumerate(lines, 1) if text in s]
    assert len(hits) == 1, f"{text!r} found on lines {hits} of {path}"
    return f"{os.path.realpath(path)}:{hits[0]}"


def at(tag: str) -> str:
    return line_of(__file__, f"# [{tag}]")


def normal(where: str) -> str:
    path, line = where.rsplit(":", 1)
    return f"{os.path.realpath(path)}:{line}"


def where_of(finding: probes.Finding) -> str:
    return normal(finding.where)


def make(device: str, fused: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """The compact MLP with a small-init output layer (docs/loss_scaling.md), AdamW (`fused`:
    the kernel that unscales and skips by itself), and eight batches of a regression task."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                          nn.Linear(64, 4)).to(device)
    with torch.no_grad():
        model[4].weight.mul_(2.0**-10)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 16, generator=g).to(device),
                (0.1 * torch.randn(32, 4, generator=g)).to(device)) for _ in range(8)]
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None), batches


def loop(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
         batches: list, dtype: torch.dtype | None, seed: str | None = None) -> None:
    """A user's loop; `seed` plants one misuse."""
    device_type = batches[0][0].device.type
    for i, (x, y) in enumerate(batches):
        optimizer.zero_grad()
        with torch.autocast(device_type, dtype=dtype or BF16, enabled=dtype is not None):
            loss = F.mse_loss(model(x), y)  # [forward]
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        if seed == "backward_not_scaled" and i > 0:  # torch itself refuses it at i == 0
            loss.backward()
        else:
            scaler.scale(loss).backward()  # [scale]
        if seed == "clip_norm_before_unscale":
            clip_grad_norm_(model.parameters(), 1.0)  # [clip norm early]
        if seed == "clip_value_before_unscale":
            nn.utils.clip_grad_value_(model.parameters(), 1.0)  # [clip value early]
        scaler.unscale_(optimizer)  # [unscale]
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if seed == "step_bypasses_scaler":
            optimizer.step()  # [optimizer step]
        else:
            scaler.step(optimizer)  # [step]
        if seed != "update_missing":
            scaler.update()  # [update]
        if seed == "update_twice":
            scaler.update()  # [update again]


def guarded(device: str, scaler: torch.amp.GradScaler | None, dtype: torch.dtype | None,
            seed: str | None = None, *, corrupt: slice | None = None, fused: bool = False,
            **options: object) -> ScalerGuard:
    """loop() under a guard; `corrupt`: those batches carry a NaN sample (a data bug)."""
    model, optimizer, batches = make(device, fused)
    if corrupt is not None:
        batches = batches * 3
        for i in range(len(batches))[corrupt]:
            x, y = batches[i]
            batches[i] = (x.clone().index_fill_(0, torch.tensor([0], device=x.device),
                                                float("nan")), y)
    with ScalerGuard(scaler, optimizer, model=model, **options) as guard:  # type: ignore[arg-type]
        loop(model, optimizer, scaler, batches, dtype, seed)
    return guard


def only(guard: ScalerGuard) -> tuple[str, str]:
    findings = guard.report()
    assert len(findings) == 1, [str(f) for f in findings]
    return findings[0].kind, where_of(findings[0])


@pytest.mark.parametrize("seed, tag", [
    ("clip_norm_before_unscale", "clip norm early"),
    ("clip_value_before_unscale", "clip value early"),
    ("step_bypasses_scaler", "optimizer step"),
    ("backward_not_scaled", "unscale"),
])
def test_an_order_mistake_is_reported_once_at_its_line(device: str, seed: str, tag: str) -> None:
    """Clipping before unscale_ (clip_grad_norm_ bound early, or clip_grad_value_), stepping
    the optimizer past the scaler, backward on the unscaled loss: that finding, that line."""
    kind = "clip_before_unscale" if seed.startswith("clip") else seed
    guard = guarded(device, torch.amp.GradScaler(device), FP16, seed)
    assert only(guard) == (kind, at(tag))
    assert guard.report()[0].severity == "error"
    assert guard.report()[0].count == (7 if seed == "backward_not_scaled" else 8)


def test_clipping_before_unscale_with_a_disabled_scaler_is_a_warning(device: str) -> None:
    """Harmless while disabled (fp32), wrong once enabled: reported, as a warning."""
    guard = guarded(device, torch.amp.GradScaler(device, enabled=False), None,
                    "clip_norm_before_unscale")
    assert only(guard) == ("clip_before_unscale", at("clip norm early"))
    assert guard.report()[0].severity == "warning"


def test_update_missing_is_named_at_the_next_unscale_and_on_torchs_error(device: str) -> None:
    """torch raises at the second iteration's unscale_; the guard names the misuse there,
    and adds it to torch's error as a note (Python 3.11+)."""
    with pytest.raises(RuntimeError, match="unscale_") as err:
        guarded(device, torch.amp.GradScaler(device), FP16, "update_missing")
    if sys.version_info >= (3, 11):
        notes = [n.removeprefix("scaler_guard: ") for n in err.value.__notes__]
        assert [normal(n.split(": ", 1)[0]) for n in notes if "update_missing" in n] == \
            [at("unscale")]
    model, optimizer, batches = make(device)
    scaler = torch.amp.GradScaler(device)
    with ScalerGuard(scaler, optimizer) as guard:
        loop(model, optimizer, scaler, batches[:1], FP16, "update_missing")
    assert only(guard) == ("update_missing", at("step"))  # the last step: seen by report()


def test_update_twice_is_named_at_the_second_update(device: str) -> None:
    """torch's AssertionError ("No inf checks were recorded") carries the finding."""
    model, optimizer, batches = make(device)
    scaler = torch.amp.GradScaler(device)
    with ScalerGuard(scaler, optimizer) as guard, pytest.raises(AssertionError):
        loop(model, optimizer, scaler, batches, FP16, "update_twice")
    assert only(guard) == ("update_twice", at("update again"))


@pytest.mark.parametrize("enabled", [None, False])
def test_fp16_autocast_without_an_enabled_scaler_is_named_at_the_forward(
        device: str, enabled: bool | None) -> None:
    """No scaler at all, or GradScaler(enabled=False): fp16_without_scaler, the forward's line."""
    scaler = None if enabled is None else torch.amp.GradScaler(device, enabled=False)
    guard = guarded(device, scaler, FP16)
    assert only(guard) == ("fp16_without_scaler", at("forward"))
    assert ("no GradScaler" if enabled is None else "a disabled") in guard.report()[0].message


def test_bf16_with_an_enabled_scaler_is_advice_not_an_error(device: str) -> None:
    guard = guarded(device, torch.amp.GradScaler(device), BF16)
    assert only(guard) == ("bf16_needs_no_scaler", at("scale"))
    assert guard.report()[0].severity == "advice"


@pytest.mark.parametrize("fused", [False, True])
def test_a_skipped_step_is_exposed_at_the_step_line(device: str, fused: bool) -> None:
    """One NaN sample in batch 2 of 24: that step alone is skipped, reported as info, and
    guard.skipped_steps says which; also for a fused AdamW, which GradScaler always calls
    (it skips by itself: NOTE [ The skipped-step signal ])."""
    guard = guarded(device, torch.amp.GradScaler(device), FP16, corrupt=slice(2, 3),
                    fused=fused)
    assert only(guard) == ("step_skipped", at("step"))
    assert guard.skipped_steps == [2] and guard.report()[0].severity == "info"


def test_a_scale_collapsing_below_one_is_reported_at_the_update(device: str) -> None:
    """Every batch from the first carries a NaN: 2^16 halves 17 times to 0.5 < SCALE_FLOOR."""
    guard = guarded(device, torch.amp.GradScaler(device), FP16, corrupt=slice(0, None))
    kinds = {f.kind: where_of(f) for f in guard.report()}
    assert kinds == {"step_skipped": at("step"), "scale_collapse": at("update")}
    collapse = next(f for f in guard.report() if f.kind == "scale_collapse")
    assert collapse.step == 16 and "0.5 after 17 skipped" in collapse.message
    assert guard.skipped_steps == list(range(24))


def test_underflow_at_a_scale_of_one_is_counted_per_parameter(device: str) -> None:
    """init_scale 1, no growth: the subnormal counts reported, in all and for the three
    parameters with the most, are what frexp counts (|g| < 2^-14 iff its exponent is <= -14)
    on the same first step, run again unguarded."""
    scaler = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=10**6)
    guard = guarded(device, scaler, FP16)
    assert only(guard) == ("gradient_underflow", at("scale"))
    finding = guard.report()[0]
    assert finding.step == 0 and finding.count == 8
    model, _, batches = make(device)
    with torch.autocast(batches[0][0].device.type, dtype=FP16):
        loss = F.mse_loss(model(batches[0][0]), batches[0][1])
    loss.backward()
    counts = {name: (int(((torch.frexp(p.grad).exponent <= -14) & (p.grad != 0)).sum()),
                     p.numel(), int((p.grad == 0).sum()))
              for name, p in model.named_parameters()}
    subnormal, total = (sum(c[i] for c in counts.values()) for i in (0, 1))
    assert f"{subnormal} of {total} gradient elements" in finding.message
    assert subnormal / total > probes.UNDERFLOW_SHARE
    for name in sorted(counts, key=lambda n: -counts[n][0])[:3]:
        sub, numel, zeros = counts[name]
        assert f"{name} {sub} of {numel} ({zeros} zeros)" in finding.message
    every_third = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=10**6)
    assert only(guarded(device, every_third, FP16, underflow_every=3))[0] == "gradient_underflow"
    assert guarded(device, every_third, FP16, underflow_every=3).report()[0].count == 3
    never = torch.amp.GradScaler(device, init_scale=1.0, growth_interval=10**6)
    assert guarded(device, never, FP16, underflow_every=0).report() == []


@pytest.mark.parametrize("dtype, scaler", [
    (FP16, "default"), (BF16, None), (None, None), (BF16, "disabled"), (None, "disabled")])
def test_a_correct_loop_reports_nothing(device: str, dtype: torch.dtype | None,
                                        scaler: str | None) -> None:
    """fp16 with torch.amp.GradScaler's defaults, bf16 and fp32 without one or with a
    disabled one (GradScaler(enabled=(dtype == float16))): no finding, no skipped step."""
    made = {None: None, "default": torch.amp.GradScaler(device),
            "disabled": torch.amp.GradScaler(device, enabled=False)}[scaler]
    guard = guarded(device, made, dtype)
    assert guard.report() == [] and guard.step == 8 and guard.skipped_steps == []


@pytest.mark.parametrize("dtype", [BF16, None], ids=["bf16", "fp32"])
def test_a_disabled_scaler_after_an_unscaled_backward_reports_nothing(
        device: str, dtype: torch.dtype | None) -> None:
    """GradScaler(enabled=False) passes gradients through: loss.backward() with no
    scale(loss), then unscale_, step and update (the loop's backward_not_scaled seed, which
    an enabled scaler reports), is no misuse, and no step is skipped."""
    guard = guarded(device, torch.amp.GradScaler(device, enabled=False), dtype,
                    "backward_not_scaled")
    assert guard.report() == [] and guard.step == 8 and guard.skipped_steps == []


def test_accumulation_and_a_scheduler_built_under_the_guard_report_nothing(device: str) -> None:
    """Two backward passes per step (scale() twice, one unscale_/step/update), and an
    LRScheduler built on the guarded optimizer (the guard hands back the optimizer itself)."""
    model, optimizer, batches = make(device)
    scaler = torch.amp.GradScaler(device)
    with ScalerGuard(scaler, optimizer, model=model) as guard:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
        for i in range(0, len(batches), 2):
            for x, y in batches[i:i + 2]:
                with torch.autocast(x.device.type, dtype=FP16):
                    loss = F.mse_loss(model(x), y) / 2
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            schedule.step()
    assert guard.report() == [] and guard.step == 4


def test_strict_raises_at_the_misuse_and_raise_on_picks_kinds(device: str) -> None:
    with pytest.raises(ScalerMisuse, match="clip_before_unscale") as err:
        guarded(device, torch.amp.GradScaler(device), FP16, "clip_norm_before_unscale",
                strict=True)
    assert where_of(err.value.finding) == at("clip norm early")
    with pytest.raises(ScalerMisuse, match="step_skipped"):
        guarded(device, torch.amp.GradScaler(device), FP16, corrupt=slice(2, 3),
                raise_on=("step_skipped",))
    model, optimizer, _ = make(device)
    with pytest.raises(ValueError, match="unknown kinds"):
        ScalerGuard(None, optimizer, raise_on=("clip",))
    with pytest.raises(ValueError, match="underflow_every must be >= 0"):
        ScalerGuard(None, optimizer, underflow_every=-1)
    with pytest.raises(TypeError, match=r"must be a torch\.optim\.Optimizer"):
        ScalerGuard(None, model)  # type: ignore[arg-type]
    scaler = torch.amp.GradScaler(device)
    with ScalerGuard(scaler, optimizer), pytest.raises(RuntimeError, match="already guarded"):
        ScalerGuard(scaler, make(device)[1]).start()


def test_a_disabled_scaler_updated_after_a_direct_optimizer_step_is_no_misuse(
        device: str) -> None:
    """bf16 code that steps the optimizer itself and still calls the (disabled) scaler's
    update each iteration: not update_twice."""
    model, optimizer, batches = make(device)
    scaler = torch.amp.GradScaler(device, enabled=False)
    with ScalerGuard(scaler, optimizer) as guard:
        for x, y in batches:
            with torch.autocast(x.device.type, dtype=BF16):
                loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            scaler.update()
            optimizer.zero_grad()
    assert guard.report() == [] and guard.step == 8


def test_closing_leaves_torch_and_the_scaler_as_they_were(device: str) -> None:
    """After the guard: torch's clip functions are its own again, the scaler pickles, and
    a further misuse is no longer seen."""
    originals = (nn.utils.clip_grad_norm_, nn.utils.clip_grad_value_,
                 nn.utils.clip_grad._clip_grads_with_norm_)
    model, optimizer, batches = make(device)
    scaler = torch.amp.GradScaler(device)
    with ScalerGuard(scaler, optimizer) as guard:
        assert nn.utils.clip_grad._clip_grads_with_norm_ is not originals[2]
        loop(model, optimizer, scaler, batches[:2], FP16)
    assert (nn.utils.clip_grad_norm_, nn.utils.clip_grad_value_,
            nn.utils.clip_grad._clip_grads_with_norm_) == originals
    assert not set(scaler.__dict__) & {"scale", "unscale_", "step", "update"}
    pickle.dumps(scaler)
    loop(model, optimizer, scaler, batches[:2], FP16, "clip_norm_before_unscale")
    assert guard.report() == [] and guard.step == 2


PROJECT = TrainConfig(sizes=(8, 32, 32, 3), batch_size=16, num_samples=64, horizon=8,
                      max_grad_norm=1.0)


SLOW = pytest.mark.slow  # the transformer's Run takes about 3 s to build and step


@pytest.mark.parametrize("options", [
    {"precision": "fp16"}, {"precision": "bf16"}, {"precision": "fp32"},
    {"precision": "fp16", "recompute": "uniform:2", "dropout": 0.1, "optimizer": "SGD"},
    pytest.param({"precision": "fp16", "model": "gpt"}, marks=SLOW),
    pytest.param({"precision": "bf16", "model": "gpt"}, marks=SLOW),
], ids=lambda o: "-".join(map(str, o.values())))
def test_the_projects_own_training_step_reports_nothing(device: str, options: dict) -> None:
    """torch_impl/train.py's Run (make_scaler's scaler, clipping after unscale_), guarded
    for 8 steps; then its seeded fault clip_before_unscale is caught at train.py's line."""
    run = ttrain.Run(TrainConfig(**{**PROJECT.__dict__, **options}), device)
    with ScalerGuard(run.scaler, run.optimizer, model=run.model) as guard:
        for _ in range(8):
            run.train_step()
        assert guard.report() == [] and guard.step == 8
        run.step_fault = "clip_before_unscale"
        run.train_step()
    clip = line_of(ttrain.__file__, 'if fault == "clip_before_unscale" and max_grad_norm')
    path, line = clip.rsplit(":", 1)
    assert only(guard) == ("clip_before_unscale", f"{path}:{int(line) + 1}")
    assert guard.report()[0].severity == ("error" if run.scaler.is_enabled() else "warning")


def test_the_projects_fp16_without_scaler_fault_is_caught_at_its_forward(device: str) -> None:
    """train_step(fault="fp16_without_scaler") with make_scaler("fp32"): the forward line."""
    model, optimizer, batches = make(device)
    scaler = make_scaler("fp32", device)
    with ScalerGuard(scaler, optimizer) as guard:
        ttrain.train_step(model, nn.MSELoss(), optimizer, scaler, *batches[0],
                          precision="fp16", fault="fp16_without_scaler")
    assert only(guard) == ("fp16_without_scaler",
                           line_of(ttrain.__file__, "output = model(x) if schedule is None"))


def test_the_underflow_threshold_separates_a_healthy_scale_from_a_small_one(device: str) -> None:
    """NOTE [ What the underflow count measures ]'s choice, held: on the first step of the
    MLP the model-wide subnormal share is over 8x below UNDERFLOW_SHARE at S = 2^16 and over
    4x above it at S = 2^10 and S = 1."""
    shares = {}
    for scale in (2.0**16, 2.0**10, 1.0):
        model, _, batches = make(device)
        with torch.autocast(batches[0][0].device.type, dtype=FP16):
            loss = F.mse_loss(model(batches[0][0]), batches[0][1])
        (loss * scale).backward()
        grads = [p.grad for p in model.parameters()]
        stats = probes.underflow_stats(grads)
        assert stats is not None
        shares[scale] = sum(s[0] for s in stats) / sum(g.numel() for g in grads)
    assert shares[2.0**16] < probes.UNDERFLOW_SHARE / 8, shares
    assert min(shares[2.0**10], shares[1.0]) > 4 * probes.UNDERFLOW_SHARE, shares
