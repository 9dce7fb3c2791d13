"""What scaler_guard.py observes a user's loop with, and what it reports: the
finding types, the user's line, the probes on clipping and on the forward, and the
underflow count. See scaler_guard.py for the checks themselves.

NOTE [ Instrument in place ] (the probes' part; scaler_guard.py has the scaler's):
- clipping is seen by wrapping torch.nn.utils' clip_grads_with_norm_ and clip_grad_value_,
  and clip_grad's own _clip_grads_with_norm_, which clip_grad_norm_ looks up at call time
  and hands its own list of parameters: a `from torch.nn.utils import clip_grad_norm_` bound
  before the guard started is seen, and its empty-generator warning is kept. An early-bound
  clip_grad_value_, or clipping written by hand, is not seen. (A torch without
  _clip_grads_with_norm_ gets clip_grad_norm_ wrapped by name.)
- autocast is read by a forward pre-hook: on the guard's `model` when given, else one global
  module hook (nn.modules.module.register_module_forward_pre_hook) that looks only at
  modules owning a guarded parameter. It reads torch.is_autocast_enabled and
  torch.get_autocast_dtype of the parameters' device type while the forward runs.
The wrappers and the global hook exist while at least one guard is active.

NOTE [ What the underflow count measures ]: before unscale_, a gradient that passed through
float16 holds S g rounded to float16. Elements in float16's subnormal range, 0 < |S g| <
2^-14, kept fewer than 11 significant bits, and they are the visible edge of the elements
of 2^-25 or less that became exactly 0. Zeros alone prove nothing (a dead ReLU, an unused
embedding row are exact zeros in float32 too), and neither does one small tensor: a key
bias's gradient is mathematically 0 (softmax ignores a shift) and comes out as rounding
noise, subnormal by nature (13 of 96 elements of one c_attn.bias of the project's GPT at
S = 2^16). So the trigger is model-wide: more than UNDERFLOW_SHARE = 2^-5 of all the guarded
gradient elements are subnormal; the three parameters with the most are named, zeros beside.
The share is a choice, not a derivation, set between what was measured on the first step:
0.09% (the GPT) and 0.27% (the MLP of tests/test_scaler_guard.py) at S = 2^16, against 21%
at S = 2^10 and 85% at S = 1 (the MLP). The fix depends on the headroom FP16_MAX / max|S g|:
at 2x or more the scale could grow; below, the gradients span more binades than float16
holds and bf16 is the fix. Cost: one pass per parameter (two counts, a max, a finiteness
check) and one host sync, every `underflow_every`-th step.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "KINDS", "UNDERFLOW_SHARE", "Finding", "ScalerMisuse",
           "attach", "detach", "underflow_stats", "user_line"]

FP16_MAX = float.fromhex("0x1.ffcp15")  # 65504
FP16_MIN_NORMAL = float.fromhex("0x1p-14")  # 6.1e-5
UNDERFLOW_SHARE = float.fromhex("0x1p-5")  # 3.1%: NOTE [ What the underflow count measures ]

# kind -> (severity, fix); severity "error" | "warning" | "advice" | "info"
KINDS: dict[str, tuple[str, str]] = {
    "clip_before_unscale": ("error", "call scaler.unscale_(optimizer) before clipping, so the "
                            "clip measures the true gradients, not S times them"),
    "fp16_without_scaler": ("error", "use torch.amp.GradScaler(enabled=True): "
                            "scaler.scale(loss).backward(), scaler.step(optimizer), "
                            "scaler.update()"),
    "update_missing": ("error", "call scaler.update() once per iteration, after "
                       "scaler.step(optimizer)"),
    "update_twice": ("error", "call scaler.update() once per iteration"),
    "step_bypasses_scaler": ("error", "call scaler.step(optimizer), not optimizer.step(): it "
                             "unscales and skips a step with inf/NaN gradients"),
    "backward_not_scaled": ("error", "backpropagate scaler.scale(loss), not loss: step "
                            "divides the gradients by S"),
    "scale_collapse": ("error", "find the first inf/NaN (torch.autograd.detect_anomaly, or "
                       "torch_impl.numerics): it does not come from the scale, and a floor "
                       "would only hide it"),
    "gradient_underflow": ("warning", "raise init_scale, or shorten growth_interval"),
    "bf16_needs_no_scaler": ("advice", "drop the scaler, or GradScaler(enabled=False): bf16 "
                             "has float32's exponent range"),
    "step_skipped": ("info", "none needed now and then; count a skipped step as not taken "
                     "(guard.last_step_skipped) in LR schedules and logs"),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One misuse: `where` is the user's file:line, `step` the first iteration (from 0) it
    was seen in, `count` how many times; severity as KINDS unless the scaler is disabled
    (then an order mistake is a "warning": harmless until it is enabled)."""

    kind: str
    message: str
    fix: str
    where: str
    severity: str
    step: int
    count: int = 1

    def __str__(self) -> str:
        return f"{self.where}: {self.severity}: {self.kind}: {self.message}. Fix: {self.fix}."


class ScalerMisuse(RuntimeError):
    """Raised at the misuse for the kinds in `raise_on` (strict: every error)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


_OURS = {os.path.abspath(__file__),
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaler_guard.py")}
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_line() -> str:
    """file:line of the innermost frame outside torch and the guard's two files."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if name not in _OURS and not name.startswith(_TORCH):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


class Listener(Protocol):
    """What a guard offers the probes."""

    model: nn.Module | None

    def on_clip(self, params: list[Any], name: str) -> None: ...

    def on_forward(self, module: nn.Module | None) -> None: ...


_ACTIVE: list[Listener] = []
_PATCHED: list[tuple[Any, str, Any]] = []  # (module, name, original)
_HOOK: list[Any] = []  # the global forward pre-hook's handle


def _clip_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def clipping(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(parameters, torch.Tensor):
            parameters = list(parameters)  # a generator is read once: hand on the list
        caller = sys._getframe(1).f_code.co_name
        name = caller if caller == "clip_grad_norm_" else fn.__name__.lstrip("_")
        params = [parameters] if isinstance(parameters, torch.Tensor) else parameters
        for listener in list(_ACTIVE):
            listener.on_clip(params, name)
        return fn(parameters, *args, **kwargs)
    return clipping


def _global_forward(module: nn.Module, args: Any) -> None:
    for listener in _ACTIVE:
        if listener.model is None:
            listener.on_forward(module)


def attach(listener: Listener) -> None:
    """Start telling `listener` of clipping and forwards (the first installs the probes)."""
    if not _ACTIVE:
        utils, clip_grad = torch.nn.utils, torch.nn.utils.clip_grad
        inner = hasattr(clip_grad, "_clip_grads_with_norm_")
        targets = [(clip_grad, "_clip_grads_with_norm_" if inner else "clip_grad_norm_"),
                   (clip_grad, "clip_grad_value_"), (utils, "clip_grads_with_norm_"),
                   (utils, "clip_grad_value_"), *([] if inner else [(utils, "clip_grad_norm_")])]
        for module, name in targets:
            if hasattr(module, name):
                original = getattr(module, name)
                _PATCHED.append((module, name, original))
                setattr(module, name, _clip_wrapper(original))
        _HOOK.append(nn.modules.module.register_module_forward_pre_hook(_global_forward))
    _ACTIVE.append(listener)


def detach(listener: Listener) -> None:
    """Stop telling `listener`; the last one out restores torch's functions."""
    _ACTIVE.remove(listener)
    if not _ACTIVE:
        while _PATCHED:
            module, name, original = _PATCHED.pop()
            setattr(module, name, original)
        while _HOOK:
            _HOOK.pop().remove()


def underflow_stats(grads: list[torch.Tensor]) -> list[tuple[int, int, float]] | None:
    """Per gradient (subnormal count, zero count, max |g|) in float16's terms (NOTE [ What
    the underflow count measures ]); None when any element is inf/NaN (a skipped step)."""
    rows = torch.stack([torch.stack([
        (g != 0).logical_and(g.abs() < FP16_MIN_NORMAL).sum().double(),
        (g == 0).sum().double(), g.abs().max().double(), torch.isfinite(g).all().double()])
        for g in grads]).tolist()
    if not all(finite for *_, finite in rows):
        return None
    return [(int(sub), int(zeros), amax) for sub, zeros, amax, _ in rows]
