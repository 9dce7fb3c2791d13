"""Finding the first invalid value with PyTorch. See reference/numerics.py for the counts, the
report and the replay, common/numerics_detect.py for the detector's control flow (this
Detector supplies torch's calls).

What PyTorch does differently or hides:
- The hooks are torch's own global module hooks
  (torch.nn.modules.module.register_module_forward_hook), fired by Module.__call__; the op
  is `output.grad_fn.name()`, read off the autograd graph (the reference looks its name up).
  A micro-step's gradients are taken by Tensor.register_hook on each parameter, which
  AccumulateGrad calls with the gradient before adding it (the reference wraps
  Parameter.accumulate).
- The format view casts: `x.to(float16)` is inf (or zero) exactly where the reference's
  thresholds say it is, so the two count the same values by different means.
- No host synchronization in the hooks: they only keep references; when a micro-step is
  counted (the next begins or the step ends) each large output and gradient is counted on
  its integer bits, the extremes of its magnitude deciding its row (NOTE [ Counting by the
  magnitude's extremes ] in torch_impl/numerics_extremes.py), the small ones by the one-pass
  bucket count (NOTE [ One pass of counting ]), which also recounts any tensor with
  something non-finite. Off the CPU a clean micro-step reads the host once (`.tolist()` in
  `count_table`); on the CPU, where
  there is no device to wait for, each large tensor's extremes are read as they are made.
  The failing element and the input ranges are read only in a step that found something.
- The backward check is torch.autograd.detect_anomaly(check_nan=True) itself: it raises
  "Function 'XBackward0' returned nan values in its 0th output." and warns with the forward
  call's traceback; `anomaly_replay` reads the name and the traceback from those.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from common import numerics_detect
from common.fp8_train import autocast_precision
from common.numerics_report import (  # plain data: the report
    COLUMNS,
    FirstInvalid,
    Found,
    InputRange,
    NonFinite,
    ReplayResult,
    format_counts,
    totals,
)
from torch_impl import amp, numerics_locate
from torch_impl.format_spec import get_format
from torch_impl.numerics_counts import count_rows, past_range
from torch_impl.numerics_extremes import count_table

__all__ = ["COLUMNS", "Detector", "FirstInvalid", "InputRange", "NonFinite", "ReplayResult",
           "anomaly_replay", "count_rows", "count_table", "format_counts", "totals", "view_format"]

VIEWS = ("ViewBackward0", "UnsafeViewBackward0")  # a reshape of the op's result


def op_name(module: nn.Module, output: Any) -> str:
    """torch's autograd node of the output (the module's type name when there is none),
    through a reshape (a Linear on (B, T, C) is addmm on (B T, C) viewed back)."""
    grad_fn = getattr(output, "grad_fn", None)
    while grad_fn is not None and grad_fn.name() in VIEWS and grad_fn.next_functions:
        grad_fn = grad_fn.next_functions[0][0]
    return grad_fn.name() if grad_fn is not None else type(module).__name__


def view_format(precision: str) -> str:
    """The format the counts view values in: the autocast format, float16 for fp32 and for
    the scaled precisions (whose non-GEMM ops run in float32)."""
    dtype = amp.autocast_dtype(autocast_precision(precision)) or torch.float16
    return str(dtype).removeprefix("torch.")


def first_nonfinite(x: torch.Tensor) -> tuple[tuple[int, ...], str]:
    """(index, value) of the first non-finite element of x in C order."""
    flat = int(torch.nonzero(~torch.isfinite(x.detach().reshape(-1)))[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), x.shape))
    return index, repr(float(x.detach().reshape(-1)[flat]))


def input_range(name: str, x: torch.Tensor, dtype: torch.dtype) -> InputRange:
    x = x.detach().to(torch.float64)
    finite = x[torch.isfinite(x)]
    low, high = ((None, None) if finite.numel() == 0
                 else (float(finite.min()), float(finite.max())))
    beyond = int(past_range(finite.abs(), dtype).sum())  # NOTE [ Overflow without inf ]
    return InputRange(name, low, high, int(x.numel() - finite.numel()), beyond)


def input_ranges(module: nn.Module, args: tuple, dtype: torch.dtype) -> tuple[InputRange, ...]:
    """The op's inputs: the call's arguments (its float keyword arguments by name), then the
    module's own parameters."""
    names = ("input", "target") if len(args) == 2 else ("input",)
    named = [*zip(names, args, strict=False), *getattr(args, "kwargs", {}).items()]
    ranges = [input_range(n, a, dtype) for n, a in named
              if isinstance(a, torch.Tensor) and a.is_floating_point()]
    params = module.named_parameters(recurse=False)
    return tuple(ranges + [input_range(n, p, dtype) for n, p in params])


def leaf_paths(model: nn.Module, loss_fn: nn.Module | None) -> dict[int, str]:
    """id -> path of every leaf module (no children) and of the loss ("loss")."""
    paths = {id(m): path for path, m in model.named_modules() if next(m.children(), None) is None}
    return paths if loss_fn is None else {**paths, id(loss_fn): "loss"}


def all_paths(model: nn.Module, loss_fn: nn.Module | None) -> dict[int, str]:
    """id -> path of every module, containers too (numerics_locate climbs them)."""
    paths = {id(m): path for path, m in model.named_modules()}
    return {**paths, **leaf_paths(model, loss_fn)}


class Detector(numerics_detect.Detector):
    """common/numerics_detect.py's Detector on torch's global forward hook: torch's calls
    only, the counts read with one sync per micro-step (`_count`).

    Any nn.Module: it knows no layer names, only module paths. `loss_fn` is the loss module
    (reported as "loss") or None when the model computes its loss itself (transformers'
    `labels=`); keyword arguments are recorded with each call (numerics_locate.Call), and a
    container's tuple or ModelOutput output is looked through. torch_impl/numerics_any.py
    drives it around any trainer's step."""

    locate = numerics_locate

    def __init__(self, model: nn.Module, loss_fn: nn.Module | None, fmt: str, *,
                 scaler_enabled: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Detector: model must be an nn.Module, got "
                            f"{type(model).__name__}")
        if loss_fn is not None and not isinstance(loss_fn, nn.Module):
            raise TypeError("Detector: loss_fn must be an nn.Module (its output is watched "
                            f"as 'loss') or None, got {type(loss_fn).__name__}")
        super().__init__(model, get_format(fmt), all_paths(model, loss_fn),
                         set(leaf_paths(model, loss_fn)), scaler_enabled=scaler_enabled,
                         autocast=numerics_locate.autocast_state("cpu"))
        self.dtype = self.fmt.dtype
        self._params = list(model.named_parameters())

    def _register_forward_hook(self, hook: Callable[[nn.Module, tuple, Any], None]) -> Any:
        def with_kwargs(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            hook(module, numerics_locate.Call.of(args, kwargs), output)

        return nn.modules.module.register_module_forward_hook(with_kwargs, with_kwargs=True)

    def _autocast_state(self, output: Any) -> numerics_locate.Autocast | None:
        if not isinstance(output, torch.Tensor):
            return None  # no device to ask
        return numerics_locate.autocast_state(output.device.type)

    def _grads(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, p.grad) for name, p in self._params if p.grad is not None]

    def _register_grad_hooks(self, hook: Callable[[str, torch.Tensor], None]
                             ) -> list[tuple[str, Any]]:
        """Tensor.register_hook on each parameter: a leaf's hook gets the gradient before
        AccumulateGrad adds it to .grad (NOTE [ Counting the increment ])."""
        return [(name, p.register_hook(functools.partial(_give, hook, name)))
                for name, p in self._params if p.requires_grad]

    def _count(self, tensors: list[torch.Tensor]) -> list[list[int]]:
        return count_table(tensors, self.dtype)  # one sync in a clean step

    def _op_name(self, module: nn.Module, output: Any) -> str:
        return op_name(module, output)

    def _first_nonfinite(self, x: torch.Tensor) -> tuple[tuple[int, ...], str]:
        return first_nonfinite(x)

    def _input_ranges(self, module: nn.Module, args: tuple) -> tuple[InputRange, ...]:
        return input_ranges(module, args, self.dtype)

    def _watch_ops(self, module: nn.Module, args: tuple) -> Found | None:
        return numerics_locate.watch_ops(module, args, self._autocast, self.dtype,
                                         input_range, first_nonfinite)

    def _made(self, *where: Any) -> FirstInvalid:
        report = super()._made(*where)
        return report if report.module else replace(report, module=model_name(self.model))


def _give(hook: Callable[[str, torch.Tensor], None], name: str, grad: torch.Tensor) -> None:
    hook(name, grad)  # None: the gradient goes on unchanged


def model_name(model: nn.Module) -> str:
    """NOTE [ The model's own name ] in reference/numerics.py: the root, by its class."""
    return type(model).__name__


# NOTE [ Backward names ] in reference/numerics.py: what detect_anomaly checks and names.
_ANOMALY = re.compile(r"Function '(\w+)' returned nan values in its (\d+)th output")
_TRACEBACK = re.compile(r"Error detected in (\w+)\. Traceback of forward call that caused the "
                        r"error:\n(.*)", re.S)


class _Stop(Exception):
    """The replay ends before the optimizer."""


def anomaly_replay(model: nn.Module, loss_fn: nn.Module | None,
                   step: Callable[[Callable], Any]
                   ) -> ReplayResult:
    """Run `step(phase)` (one train_step on the saved batch, stopped before the optimizer)
    under torch.autograd.detect_anomaly(check_nan=True); name the node it names."""
    paths = leaf_paths(model, loss_fn)
    ran: list[str] = []  # the leaves whose output's backward node has run, in order

    def forward_hook(module: nn.Module, args: tuple, output: Any) -> None:
        if id(module) in paths and getattr(output, "grad_fn", None) is not None:
            path = paths[id(module)]  # a post-hook runs before the engine's NaN check
            output.grad_fn.register_hook(lambda grad_inputs, grad_outputs: ran.append(path))

    @contextmanager
    def stop_before_optimizer(name: str) -> Iterator[None]:
        if name == "optimizer":
            raise _Stop
        yield

    handle = nn.modules.module.register_module_forward_hook(forward_hook)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                step(stop_before_optimizer)
        except RuntimeError as e:
            found = _ANOMALY.search(str(e))
            if found is None:
                raise
            forward = [m for w in caught if (m := _TRACEBACK.search(str(w.message)))]
            stack = forward[0].group(2).split(" (Triggered internally")[0] if forward else ""
            return ReplayResult(found.group(1), ran[-1] if ran else None, stack)
        except _Stop:
            pass
        finally:
            handle.remove()
    return ReplayResult(None, None, "")


# ---------------------------------------------------------------- any trainer's step
def checked_step(detector: Detector, step: int, loss_of: Callable[[], torch.Tensor],
                 optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One step of any trainer under `detector`, one micro-step: loss_of() (the forward, its
    autocast inside it), loss.backward(), optimizer.step() and zero_grad. NonFinite leaves
    from end_step, before the update, naming step, module path, op and the inputs."""
    detector.step = step
    with detector.micro_step():
        loss = loss_of()
    loss.backward()
    detector.end_step()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def replay_step(model: nn.Module, loss_of: Callable[[], torch.Tensor],
                loss_fn: nn.Module | None = None) -> ReplayResult:
    """anomaly_replay of one forward and backward of loss_of() (the same batch and weights
    as the step that failed): the backward node that first returned NaN and its module.
    The gradients it leaves in .grad are the replay's: zero them before training on."""
    def step(phase: Callable[[str], Any]) -> None:
        with phase("forward"):
            loss = loss_of()
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            pass

    return anomaly_replay(model, loss_fn, step)
