"""Loss-scaling misuse caught at runtime in a user's own loop. See docs/your-trainer.md,
"Loss-scaling misuse", for what each check catches, and torch_impl/train.py for the order it
holds a loop to: scale(loss).backward(), unscale_, clip, step, update.

    with ScalerGuard(scaler, optimizer) as guard:   # the loop inside is unchanged
        for x, y in loader: ...
    for finding in guard.report(): print(finding)   # Finding(kind, message, fix, where, ...)

NOTE [ Instrument in place ]: the guard hands back nothing new: `guard.scaler` and
`guard.optimizer` are the user's own objects. LRScheduler refuses a non-Optimizer,
GradScaler keys its per-optimizer state by id(optimizer), checkpoints pickle state_dicts: a
proxy would break one of them. So the optimizer gets a step pre-hook
(Optimizer.register_step_pre_hook, torch 2.0+), and the scaler's scale, unscale_, step and
update are wrapped in its instance dict (the class is untouched; close() removes both, and
the scaler pickles again). Clipping and autocast are probed as scaler_guard_probes.py says.
`where` is the innermost frame outside torch and the guard: the user's line.

NOTE [ The skipped-step signal ]: scaler.step returns None whether it skipped or the
optimizer returned None, and update() then clears the found_inf flags. Every GradScaler
since torch 1.6 calls optimizer.step only when no inf/NaN was found (`_maybe_opt_step`,
torch 2.6 and 2.13 alike), so the step pre-hook firing inside scaler.step IS the signal,
read without private state. An optimizer with `_step_supports_amp_scaling` (it skips by
itself) is always called: for it the found_inf flags are read (loss_scaling.step_skipped).

NOTE [ Scale floor ]: torch's backoff has no floor (docs/loss_scaling.md: 2^16 reaches
float32's 0 after 16 + 149 + 1 = 166 consecutive skips, and 0 never grows back). At S <= 1
scaling lifts no gradient, so an inf/NaN still found there does not come from the scale (a
forward overflow, a NaN loss), and every further halving only pushes the gradients toward
float16's floor; torch's update() docstring says as much ("If the scale falls below 1 ...
something is likely wrong"). A skip that leaves S < SCALE_FLOOR = 1 is reported.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from parity.lab.your_trainer import scaler_guard_probes as probes
from parity.lab.your_trainer.scaler_guard_probes import KINDS, Finding, ScalerMisuse, user_line
from torch_impl.loss_scaling import step_skipped

__all__ = ["KINDS", "SCALE_FLOOR", "Finding", "ScalerGuard", "ScalerMisuse"]

SCALE_FLOOR = 1.0  # NOTE [ Scale floor ]
_METHODS = ("scale", "unscale_", "step", "update")


class ScalerGuard:
    """Watches one (scaler, optimizer) pair while active (a context, or start()/close()).

    `scaler` may be None (a loop without one: fp16 autocast is then the misuse);
    `model` restricts the autocast probe to that module; `strict` raises ScalerMisuse at
    the first error-severity misuse, `raise_on` at the kinds named; `underflow_every`
    counts underflow every n-th step (0: never). One optimizer per scaler.
    """

    def __init__(self, scaler: torch.amp.GradScaler | None, optimizer: torch.optim.Optimizer,
                 *, model: nn.Module | None = None, strict: bool = False,
                 raise_on: Iterable[str] = (), underflow_every: int = 1) -> None:
        unknown = set(raise_on) - set(KINDS)
        if unknown:
            raise ValueError(f"ScalerGuard: raise_on names unknown kinds {sorted(unknown)}; "
                             f"known: {sorted(KINDS)}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"ScalerGuard: optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if underflow_every < 0:
            raise ValueError(f"ScalerGuard: underflow_every must be >= 0, got {underflow_every}")
        self.scaler, self.optimizer, self.model = scaler, optimizer, model
        self._raise_on = set(raise_on)
        self._underflow_every = underflow_every
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        self._param_ids = {id(p) for p in self._params}
        names = dict(model.named_parameters()) if model is not None else {}
        by_id = {id(p): n for n, p in names.items()}
        self._names = [by_id.get(id(p), f"parameter {i} {tuple(p.shape)}")
                       for i, p in enumerate(self._params)]
        self._device_type = self._params[0].device.type if self._params else "cpu"
        self._findings: dict[tuple[str, str], Finding] = {}
        self._handles: list[Any] = []
        self._active = False
        self.step = 0  # iterations seen: step attempts (scaler.step or optimizer.step)
        self.last_step_skipped = False
        self.skipped_steps: list[int] = []
        self._stage = "ready"  # of this optimizer: "ready" | "unscaled" | "stepped"
        self._last_call = ""  # the scaler's last method the user called
        self._scaled_at: str | None = None  # the scale() line since the last step
        self._autocast: dict[torch.dtype, str] = {}  # dtype -> forward line since last step
        self._in_step = False
        self._inner_ran = False
        self._skips_in_a_row = 0
        self._step_where = "<unknown>"  # the last scaler.step line
        self._counted = False  # underflow counted since the last step
        self._strict = strict
        self._recent: list[Finding] = []  # this call's findings: notes on torch's own error

    # -- lifetime
    def __enter__(self) -> ScalerGuard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ScalerGuard:
        """Instrument the scaler, the optimizer and the clip functions (NOTE [ Instrument in
        place ]); returns self."""
        if self._active:
            raise RuntimeError("ScalerGuard: already started")
        if self.scaler is not None and "step" in self.scaler.__dict__:
            raise RuntimeError("ScalerGuard: this scaler is already guarded (one optimizer "
                               "per scaler)")
        probes.attach(self)
        self._active = True
        self._handles.append(self.optimizer.register_step_pre_hook(self._on_optimizer_step))
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(
                lambda module, args: self.on_forward(None)))
        if self.scaler is not None:
            for name in _METHODS:
                original = getattr(self.scaler, name)
                wrapped = functools.wraps(original)(functools.partial(
                    getattr(self, f"_scaler_{name.rstrip('_')}"), original))
                self.scaler.__dict__[name] = wrapped
        return self

    def close(self) -> None:
        """Undo start(); the findings stay readable."""
        if not self._active:
            return
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.scaler is not None:
            for name in _METHODS:
                self.scaler.__dict__.pop(name, None)
        probes.detach(self)

    def report(self) -> list[Finding]:
        """Every finding, in the order first seen; a last step never followed by update()
        counts as update_missing."""
        if self._stage == "stepped" and self._last_call == "step":
            self._found("update_missing", self._step_where, "the last scaler.step(optimizer) "
                        "was never followed by scaler.update()" + self._latent_note(),
                        severity=self._latent(), may_raise=False)
        found = list(self._findings.values())
        steps = self.skipped_steps
        more = f" and {len(steps) - 8} more" if len(steps) > 8 else ""
        return [dataclasses.replace(f, message=f"{f.message}; skipped steps {steps[:8]}{more}")
                if f.kind == "step_skipped" else f for f in found]

    # -- recording
    def _found(self, kind: str, where: str, message: str, fix: str | None = None,
               severity: str | None = None, may_raise: bool = True, step: int | None = None
               ) -> None:
        key = (kind, where)
        if key in self._findings:
            old = self._findings[key]
            finding = self._findings[key] = dataclasses.replace(old, count=old.count + 1)
        else:
            default_severity, default_fix = KINDS[kind]
            finding = Finding(kind, message, fix or default_fix, where,
                              severity or default_severity, self.step if step is None else step)
            self._findings[key] = finding
        self._recent.append(finding)
        if may_raise and (kind in self._raise_on
                          or (self._strict and finding.severity == "error")):
            raise ScalerMisuse(finding)

    def _enabled(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()

    def _latent(self) -> str | None:
        """A sequence error is an error only while the scaler is enabled."""
        return None if self._enabled() else "warning"

    def _latent_note(self) -> str:
        return "" if self._enabled() else " (harmless while the scaler is disabled; wrong " \
                                          "once it is enabled)"

    # -- the hooks
    def on_forward(self, module: nn.Module | None) -> None:
        """A forward pre-hook: which autocast dtype the guarded parameters run under."""
        if module is not None and not any(id(p) in self._param_ids
                                          for p in module.parameters(recurse=False)):
            return
        if torch.is_autocast_enabled(self._device_type):
            dtype = torch.get_autocast_dtype(self._device_type)
            if dtype not in self._autocast:
                self._autocast[dtype] = user_line()

    def on_clip(self, params: list[Any], name: str) -> None:
        """A clip function is about to run on `params`."""
        if self.scaler is None or not any(id(p) in self._param_ids for p in params):
            return
        if self._stage == "ready" and self._scaled_at is not None:
            self._count_underflow()  # before the clip changes the scaled gradients
            self._found("clip_before_unscale", user_line(),
                        f"{name} ran on gradients still multiplied by the scale S (no "
                        f"scaler.unscale_(optimizer) before it this iteration): it clips at "
                        f"max_norm / S{self._latent_note()}", severity=self._latent())

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_step:
            self._inner_ran = True
            return
        where = user_line()
        if self._enabled() and self._scaled_at is not None:
            self._found("step_bypasses_scaler", where,
                        "optimizer.step() called directly after scaler.scale(loss).backward(): "
                        "no inf/NaN check, and no unscale unless unscale_ ran")
        self._step_checks(where)
        self._last_call = "optimizer.step"  # then an update() is not a second one
        self.step += 1

    def _step_checks(self, where: str) -> None:
        """At every step attempt: the autocast dtypes seen since the last one."""
        fp16, bf16 = self._autocast.get(torch.float16), self._autocast.get(torch.bfloat16)
        if fp16 is not None and not self._enabled():
            what = "no GradScaler" if self.scaler is None else "a disabled GradScaler"
            self._found("fp16_without_scaler", fp16,
                        f"the forward ran under float16 autocast with {what}: gradient "
                        f"elements of 2^-25 or less become 0, below 2^-14 they lose bits")
        if bf16 is not None and fp16 is None and self._enabled():
            self._found("bf16_needs_no_scaler", self._scaled_at or where,
                        "the forward ran under bfloat16 autocast with an enabled GradScaler, "
                        "which bf16 does not need (not an error)")
        self._autocast.clear()
        self._scaled_at, self._counted = None, False

    # -- the scaler's methods (NOTE [ Instrument in place ])
    def _scaler_scale(self, original: Callable[..., Any], outputs: Any) -> Any:
        self._scaled_at = user_line()
        self._last_call = "scale"
        return original(outputs)

    def _before_unscale(self, where: str) -> None:
        """unscale_, or a step that unscales: the order so far, then the underflow count."""
        if self._stage == "stepped":
            self._found("update_missing", where, f"unscale_/step again with no "
                        f"scaler.update() since the scaler.step at {self._step_where}"
                        + self._latent_note(), severity=self._latent())
        elif self._enabled() and self._scaled_at is None:
            self._found("backward_not_scaled", where, "unscale_/step with no "
                        "scaler.scale(loss) since the last step: the gradients are divided by "
                        "S, never having been multiplied by it")
        elif self._stage == "ready":
            self._count_underflow()

    def _scaler_unscale(self, original: Callable[..., Any], optimizer: Any) -> Any:
        if self._in_step or optimizer is not self.optimizer:
            return original(optimizer)
        where, self._recent = user_line(), []
        self._before_unscale(where)
        self._last_call = "unscale_"
        self._stage = "unscaled" if self._stage == "ready" else self._stage
        return _annotated(original, self._recent, optimizer)

    def _scaler_step(self, original: Callable[..., Any], optimizer: Any, *args: Any,
                     **kwargs: Any) -> Any:
        if optimizer is not self.optimizer:
            return original(optimizer, *args, **kwargs)
        where, self._recent = user_line(), []
        if self._stage != "unscaled":
            self._before_unscale(where)
        self._step_where = where
        self._step_checks(where)
        self._last_call = "step"
        self._in_step, self._inner_ran = True, False
        try:
            result = _annotated(original, self._recent, optimizer, *args, **kwargs)
        finally:
            self._in_step = False
        self._stage = "stepped"
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            skipped = step_skipped(self.scaler, optimizer)  # NOTE [ The skipped-step signal ]
        else:
            skipped = self._enabled() and not self._inner_ran
        self.last_step_skipped = skipped
        if skipped:
            self.skipped_steps.append(self.step)
            self._found("step_skipped", where, "scaler.step skipped the optimizer: inf/NaN "
                        f"gradients (first at scale {self.scaler.get_scale():g})")
        self.step += 1
        return result

    def _scaler_update(self, original: Callable[..., Any],
                       new_scale: float | torch.Tensor | None = None) -> Any:
        where, self._recent = user_line(), []
        if self._last_call == "update" and new_scale is None:
            self._found("update_twice", where, "scaler.update() called again with no "
                        "scaler.step(optimizer) since the last update" + self._latent_note(),
                        severity=self._latent(), step=max(self.step - 1, 0))
        self._last_call = "update"
        self._stage = "ready"
        result = _annotated(original, self._recent, new_scale)
        if self._enabled() and new_scale is None:
            self._skips_in_a_row = self._skips_in_a_row + 1 if self.last_step_skipped else 0
            scale = self.scaler.get_scale() if self.last_step_skipped else SCALE_FLOOR
            if scale < SCALE_FLOOR:
                self._found("scale_collapse", where,
                            f"the scale fell to {scale:g} after {self._skips_in_a_row} skipped "
                            f"steps in a row: below {SCALE_FLOOR:g} no inf/NaN comes from the "
                            f"scale, and torch's backoff has no floor", step=self.step - 1)
        return result

    def _count_underflow(self) -> None:
        """Once per step, before anything changes the scaled gradients, under fp16 autocast
        with an enabled scaler (NOTE [ What the underflow count measures ])."""
        if (self._counted or not self._enabled() or torch.float16 not in self._autocast
                or not self._underflow_every or self.step % self._underflow_every):
            return
        self._counted = True
        named = [(n, p.grad) for n, p in zip(self._names, self._params, strict=True)
                 if p.grad is not None and not p.grad.is_sparse and p.grad.numel()]
        stats = probes.underflow_stats([g for _, g in named]) if named else None
        if stats is None:
            return  # nothing to count, or inf/NaN: the step is skipped
        total = sum(g.numel() for _, g in named)
        subnormal, zeros = sum(s[0] for s in stats), sum(s[1] for s in stats)
        if subnormal / total <= probes.UNDERFLOW_SHARE:
            return
        worst = sorted(range(len(named)), key=lambda i: -stats[i][0])[:3]
        each = ", ".join(f"{named[i][0]} {stats[i][0]} of {named[i][1].numel()} ({stats[i][1]} "
                         f"zeros)" for i in worst)
        headroom = probes.FP16_MAX / max(max(s[2] for s in stats), probes.FP16_MIN_NORMAL)
        fix = None if headroom >= 2 else ("use bf16 autocast: the gradients span more "
                                          "binades than float16 holds at any one scale")
        self._found("gradient_underflow", self._scaled_at or user_line(),
                    f"at scale {self.scaler.get_scale():g}, {subnormal} of {total} gradient "
                    f"elements ({subnormal / total:.1%}) are float16 subnormals (below 2^-14) "
                    f"and {zeros} are 0; most: {each}; the largest scaled gradient is "
                    f"{headroom:.3g}x below float16's max", fix)


def _annotated(call: Callable[..., Any], recent: list[Finding], *args: Any,
               **kwargs: Any) -> Any:
    """call(*args, **kwargs); torch's own error for a misuse (step twice, update twice) gets
    the findings of this call as notes (Python 3.11+)."""
    try:
        return call(*args, **kwargs)
    except (RuntimeError, AssertionError) as err:
        for finding in recent:
            if hasattr(err, "add_note"):
                err.add_note(f"scaler_guard: {finding}")
        raise
