"""Dynamic loss scaling with torch.amp.GradScaler's API, rounding for rounding.

Why: float16's smallest subnormal is 2^-24 (5.96e-8). Gradients below half of it round to
zero in a float16 backward and the update they carry is lost. Multiplying the loss by a
scale S multiplies every gradient by S (backprop is linear in the seed), lifting them into
range; the optimizer must then see g / S, and a scale so large that some gradient
overflowed to inf (or became NaN) must be detected, the step skipped and S reduced.

One iteration, for every optimizer:
    scale(loss)  -> loss * S                        (S: a float32 scalar)
    backward     -> grads g * S
    unscale_     -> inv = f32(1 / f64(S)); found_inf = any(!isfinite(g)); g <- g * inv
    step         -> optimizer.step() unless found_inf
    update       -> the update rule, found_inf summed over the optimizers

The two kernels (unscale with the non-finite check; the update rule, with its scalar
pseudocode and the NOTEs on their rounding) are in reference/loss_scale_kernels.py. This
file is the bookkeeping around them, as torch/amp/grad_scaler.py is around torch's: the
lazily created scale, a stage per optimizer (READY -> UNSCALED -> STEPPED), the errors for
misuse, state_dict. Clipping (clip_grad_norm_, from reference/clip_grad.py) happens between
unscale_ and step; the training step that orders all of it is reference/train.py's.

Beyond torch, and off by default: `last_step_skipped` (torch gives no signal, so an LR
scheduler stepping after a skipped step warns), `min_scale`, `hysteresis`, and a
`StaticLossScaler` (fixed S, same skip logic) for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import Enum
from typing import Any

import numpy as np

from common.arg_ranges import (
    BACKOFF_FACTOR_ERROR,
    BACKOFF_FACTORS,
    GROWTH_FACTOR_ERROR,
    GROWTH_FACTORS,
)
from reference import amp
from reference.clip_grad import clip_grad_norm_, clip_grads_with_norm_, get_total_norm
from reference.loss_scale_kernels import inv_scale, non_finite_check_and_unscale_, update_scale_
from reference.nn import Parameter

__all__ = ["GradScaler", "OptState", "StaticLossScaler", "clip_grad_norm_",
           "clip_grads_with_norm_", "get_total_norm", "make_scaler", "step_skipped"]


class OptState(Enum):
    """Where an optimizer is in the iteration (torch.amp.grad_scaler.OptState)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf": None}


_FLT_MAX = float(np.finfo(np.float32).max)  # 0x1.fffffep127
_FIX = ("This may indicate your script did not use scaler.scale(loss or outputs) earlier "
        "in the iteration.")


class GradScaler:
    """torch.amp.GradScaler on NumPy arrays and reference.optim optimizers.

    Same constructor (without `device`), methods, errors and state_dict keys as torch's.
    The scale is a float32 0-d array, created lazily by the first `scale()` call; the
    growth tracker an int32. Extras (defaults reproduce torch exactly): `min_scale`, a
    floor for backoff; `hysteresis`, the number of consecutive overflows that trigger a
    backoff; `last_step_skipped`, set by `update()`: whether any optimizer step of the
    iteration just closed was skipped (None before the first update).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True, *, min_scale: float | None = None,
                 hysteresis: int = 1) -> None:
        self._enabled = enabled
        self.last_step_skipped: bool | None = None
        if not enabled:
            return
        # torch's two checks, as torch writes them (common/arg_ranges.py: NaN passes)
        if growth_factor <= GROWTH_FACTORS.low:
            raise AssertionError(GROWTH_FACTOR_ERROR)
        if backoff_factor >= BACKOFF_FACTORS.high:
            raise AssertionError(BACKOFF_FACTOR_ERROR)
        if min_scale is not None and not (math.isfinite(min_scale) and min_scale > 0):
            raise ValueError(f"GradScaler: min_scale must be a positive finite float or None, "
                             f"got {min_scale!r}")
        if not (isinstance(hysteresis, int) and hysteresis >= 1):
            raise ValueError(f"GradScaler: hysteresis must be an int >= 1, got {hysteresis!r}")
        self._init_scale = init_scale
        self._scale: np.ndarray | None = None  # float32, 0-d
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker: np.ndarray | None = None  # int32, 0-d
        self._min_scale = min_scale
        self._hysteresis = hysteresis
        self._hysteresis_tracker = hysteresis
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # -- the scale
    def _check_scale_growth_tracker(self, funcname: str) -> tuple[np.ndarray, np.ndarray]:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + _FIX)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + _FIX)
        return self._scale, self._growth_tracker

    def _lazy_init_scale_growth_tracker(self) -> None:
        # torch's torch.full refuses a finite init_scale past float32's (c10's overflows<float>)
        if math.isfinite(self._init_scale) and abs(self._init_scale) > _FLT_MAX:
            raise RuntimeError("value cannot be converted to type float without overflow")
        self._scale = np.array(self._init_scale, dtype=np.float32)
        self._growth_tracker = np.array(self._init_growth_tracker, dtype=np.int32)

    def scale(self, outputs: Any) -> Any:
        """outputs * S (an array, or a list/tuple/iterable of them); unchanged if disabled.

        The product is taken in the output's dtype (float32 or float64); float16 outputs
        are multiplied in float32 and rounded back, as torch's CPU kernel with a scalar.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, (np.ndarray, np.generic)):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker()
            return _times(np.asarray(outputs), self._scale)  # type: ignore[arg-type]
        if isinstance(outputs, Iterable):
            scaled = map(self.scale, outputs)
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    # -- unscale and step
    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer),
                                                     _refresh_per_optimizer_state())

    def _unscale_grads_(self, optimizer: Any, inv: np.ndarray, allow_fp16: bool) -> np.ndarray:
        """The non-finite check and unscale of every gradient of `optimizer` (one kernel call,
        loss_scale_kernels.non_finite_check_and_unscale_); returns found_inf (0-d float32)."""
        grads = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, Parameter):
                    raise AssertionError(
                        f"expected param to be Parameter, got {type(param).__name__}")
                if param.grad is None:
                    continue
                if not allow_fp16 and param.grad.dtype == np.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                grads.append(param.grad)
        found_inf = np.array(0.0, dtype=np.float32)
        non_finite_check_and_unscale_(grads, found_inf, inv)
        return found_inf

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by S in place (by multiplying with f32(1/f64(S)))."""
        if not self._enabled:
            return
        scale, _ = self._check_scale_growth_tracker("unscale_")
        state = self._state(optimizer)
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        state["found_inf"] = self._unscale_grads_(optimizer, inv_scale(scale), False)
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """unscale_ (unless done), then optimizer.step() unless a gradient was inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._state(optimizer)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if state["found_inf"] is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = None
        if not float(state["found_inf"]):
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    # -- update
    def update(self, new_scale: float | np.ndarray | None = None) -> None:
        """Apply the update rule (reference/loss_scale_kernels.py) once, or set S to `new_scale`."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        found_infs = [s["found_inf"] for s in self._per_optimizer_states.values()
                      if s["found_inf"] is not None]
        if new_scale is not None:
            assert self._scale is not None
            if isinstance(new_scale, float):
                self._scale[...] = new_scale
            else:
                reason = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                          "torch.FloatTensor with requires_grad=False.")
                new_scale = np.asarray(new_scale)
                if new_scale.size != 1:
                    raise AssertionError(reason)
                self._scale[...] = new_scale.reshape(())
            if found_infs:
                self.last_step_skipped = bool(sum(found_infs))
        else:
            if not found_infs:
                raise AssertionError("No inf checks were recorded prior to update.")
            found_inf_combined = found_infs[0].copy()
            for found_inf in found_infs[1:]:
                found_inf_combined += found_inf
            self._update_scale_(found_inf_combined)
            self.last_step_skipped = bool(found_inf_combined)
        self._per_optimizer_states = {}

    def _update_scale_(self, found_inf: np.ndarray) -> None:
        """The update rule, once (loss_scale_kernels.update_scale_)."""
        assert self._scale is not None and self._growth_tracker is not None
        self._hysteresis_tracker = update_scale_(
            self._scale, self._growth_tracker, found_inf, self._growth_factor,
            self._backoff_factor, self._growth_interval,
            hysteresis_tracker=self._hysteresis_tracker, hysteresis=self._hysteresis,
            min_scale=self._min_scale)

    # -- getters and setters, as torch's
    def get_scale(self) -> float:
        """S as a Python float (init_scale before the first scale(); 1.0 if disabled)."""
        if self._enabled:
            return self._init_scale if self._scale is None else float(self._scale)
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            return (self._init_growth_tracker if self._growth_tracker is None
                    else int(self._growth_tracker))
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    def _found_inf_per_device(self, optimizer: Any) -> dict[str, np.ndarray]:
        """{device: found_inf} of this iteration's unscale_ (as torch's private method)."""
        found_inf = self._state(optimizer)["found_inf"]
        return {} if found_inf is None else {"cpu": found_inf}

    # -- state
    def state_dict(self) -> dict[str, Any]:
        """torch's five entries, plus the extras' entries only when an extra is in use.

        "scale" (Python float), "growth_factor", "backoff_factor", "growth_interval",
        "_growth_tracker" (Python int); with min_scale or hysteresis > 1 also "min_scale",
        "hysteresis", "_hysteresis_tracker". {} when disabled.
        """
        if not self._enabled:
            return {}
        state: dict[str, Any] = {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }
        if self._min_scale is not None or self._hysteresis != 1:
            state.update(min_scale=self._min_scale, hysteresis=self._hysteresis,
                         _hysteresis_tracker=self._hysteresis_tracker)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict()`'s entries (a torch state_dict loads as is); no-op if disabled."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale[...] = state_dict["scale"]
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker[...] = state_dict["_growth_tracker"]
        if "hysteresis" in state_dict:
            self._min_scale = state_dict["min_scale"]
            self._hysteresis = state_dict["hysteresis"]
            self._hysteresis_tracker = state_dict["_hysteresis_tracker"]


def _times(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x * S in x's dtype (float16 through float32, as torch's opmath)."""
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"GradScaler.scale: expected a float array, got {x.dtype}")
    with np.errstate(over="ignore"):  # a scaled loss may overflow; the backward then flags it
        if x.dtype == np.float16:
            return (x.astype(np.float32) * scale).astype(np.float16)
        return x * scale.astype(x.dtype)


class StaticLossScaler(GradScaler):
    """A fixed scale S with GradScaler's API and skip logic: update() never changes S."""

    def __init__(self, scale: float = 2.0**16, enabled: bool = True) -> None:
        super().__init__(init_scale=scale, enabled=enabled)

    def _update_scale_(self, found_inf: np.ndarray) -> None:
        pass


def step_skipped(scaler: GradScaler, optimizer: Any) -> bool:
    """Whether scaler.step(optimizer) skipped this iteration; call after step, before update."""
    return scaler.is_enabled() and bool(
        sum(float(v) for v in scaler._found_inf_per_device(optimizer).values()))


def make_scaler(precision: str, **kwargs: Any) -> GradScaler:
    """GradScaler(enabled=(precision == "fp16")): fp16 needs scaling, bf16 and fp32 do not."""
    amp.autocast_dtype(precision)
    return GradScaler(enabled=(precision == "fp16"), **kwargs)
