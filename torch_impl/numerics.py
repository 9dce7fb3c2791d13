"""Finding the first invalid value with PyTorch. See reference/numerics.py for the counts, the
report and the replay.

What PyTorch does differently or hides:
- The hooks are torch's own global module hooks
  (torch.nn.modules.module.register_module_forward_hook), fired by Module.__call__; the op
  is `output.grad_fn.name()`, read off the autograd graph (the reference looks its name up).
- The format view casts: `x.to(float16)` is inf (or zero) exactly where the reference's
  thresholds say it is, so the two count the same values by different means.
- One pass and one host synchronization per step: the hooks only keep references; at the
  step's end every output and gradient is concatenated, each value gets one bucket number,
  one bincount counts every tensor's buckets, and the histogram is copied to the host once
  (`.tolist()` in `_end_step`; torch_impl/numerics_counts.py, NOTE [ One pass of counting ]);
  only a step that found something syncs again, to read the failing element and the input
  ranges.
- The backward check is torch.autograd.detect_anomaly(check_nan=True) itself: it raises
  "Function 'XBackward0' returned nan values in its 0th output." and warns with the forward
  call's traceback; `anomaly_replay` reads the name and the traceback from those.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from common.numerics_report import (  # plain data: the report
    COLUMNS,
    FirstInvalid,
    InputRange,
    NonFinite,
    ReplayResult,
    format_counts,
    totals,
)
from torch_impl import amp, numerics_locate
from torch_impl.format_spec import get_format
from torch_impl.numerics_counts import bucket_counts, count_rows, rows

__all__ = ["COLUMNS", "Detector", "FirstInvalid", "InputRange", "NonFinite", "ReplayResult",
           "anomaly_replay", "count_rows", "format_counts", "totals", "view_format"]

VIEWS = ("ViewBackward0", "UnsafeViewBackward0")  # a reshape of the op's result


def op_name(module: nn.Module, output: Any) -> str:
    """torch's autograd node of the output (the module's type name when there is none),
    through a reshape (a Linear on (B, T, C) is addmm on (B T, C) viewed back)."""
    grad_fn = getattr(output, "grad_fn", None)
    while grad_fn is not None and grad_fn.name() in VIEWS and grad_fn.next_functions:
        grad_fn = grad_fn.next_functions[0][0]
    return grad_fn.name() if grad_fn is not None else type(module).__name__


def view_format(precision: str) -> str:
    """The format the counts view values in: the autocast format, float16 for fp32."""
    dtype = amp.autocast_dtype(precision) or torch.float16
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
    beyond = int(torch.isinf(finite.to(dtype)).sum())
    return InputRange(name, low, high, int(x.numel() - finite.numel()), beyond)


def input_ranges(module: nn.Module, args: tuple, dtype: torch.dtype) -> tuple[InputRange, ...]:
    """The op's inputs: the call's arguments, then the module's own parameters."""
    names = ("input", "target") if len(args) == 2 else ("input",)
    ranges = [input_range(n, a, dtype) for n, a in zip(names, args, strict=False)
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


class Detector:
    """reference.numerics.Detector with torch's global forward hook and one sync per step."""

    def __init__(self, model: nn.Module, loss_fn: nn.Module, fmt: str, *,
                 scaler_enabled: bool) -> None:
        self.model, self.fmt, self.scaler_enabled = model, get_format(fmt), scaler_enabled
        self.dtype = self.fmt.dtype
        self.paths, self.leaves = all_paths(model, loss_fn), set(leaf_paths(model, loss_fn))
        self._params = list(model.named_parameters())
        self.step = 0  # set by the run loop before each step
        self.history: list[dict[str, list[int]]] = []
        self._seen: list[tuple[str, nn.Module, tuple, torch.Tensor]] = []  # leaves, op order
        self._calls: dict[str, tuple[nn.Module, tuple]] = {}  # every module: its first call's
        self._ended: list[tuple[int, str, Any]] = []  # containers: (leaves before, path, output)
        self._autocast: numerics_locate.Autocast = numerics_locate.autocast_state("cpu")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "forward":
            self._seen, self._calls, self._ended = [], {}, []
            handle = nn.modules.module.register_module_forward_hook(self._forward_hook)
            try:
                yield
            finally:
                handle.remove()
            return
        if name == "optimizer":
            self._end_step()
        yield

    def ops(self) -> list[tuple[str, str]]:
        """(module path, op) of every leaf output recorded this step, in op order."""
        return [(path, op_name(node, output)) for path, node, _, output in self._seen]

    def _forward_hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        path = self.paths.get(id(module))
        if path is None:
            return
        if not self._calls and isinstance(output, torch.Tensor):
            self._autocast = numerics_locate.autocast_state(output.device.type)
        self._calls.setdefault(path, (module, args))
        if id(module) in self.leaves:
            self._seen.append((path, module, args, output))
        else:  # a container: where an inline op's value ends (numerics_locate.ended_maker)
            self._ended.append((len(self._seen), path, output))

    def _end_step(self) -> None:
        grads = [(name, p.grad) for name, p in self._params if p.grad is not None]
        tensors = [output for *_, output in self._seen] + [g for _, g in grads]
        counts, slots = bucket_counts(tensors, self.dtype)
        table = rows(counts, slots)  # (modules + parameters, COLUMNS): the one sync
        names = [f"act:{path}" for path, *_ in self._seen] + [f"grad:{n}" for n, _ in grads]
        counts = dict(zip(names, table, strict=True))
        self.history.append(counts)
        report = self._first_invalid(table, grads, counts)
        if report is not None:
            raise NonFinite(report)

    def _first_invalid(self, table: list[list[int]], grads: list[tuple[str, Any]],
                       counts: dict[str, list[int]]) -> FirstInvalid | None:
        if not any(row[0] or row[1] or row[2] for row in table):  # a clean step: at once
            return None
        for i, ((path, module, args, output), row) in enumerate(zip(self._seen, table,
                                                                    strict=False)):
            if sum(row[:3]):
                return self._made(i, path, module, args, output, counts)
        if self.scaler_enabled:  # the scaler skips this step
            return None
        for (name, grad), row in reversed(list(zip(grads, table[len(self._seen):],
                                                   strict=True))):
            if sum(row[:3]):
                index, value = first_nonfinite(grad)
                return FirstInvalid(self.step, "backward", name, "", index, value,
                                    self.fmt.name, (), counts)
        return None


    def _made(self, i: int, path: str, module: nn.Module, args: tuple, output: torch.Tensor,
              counts: dict[str, list[int]]) -> FirstInvalid:
        """reference.numerics.Detector._made."""
        made = (numerics_locate.ended_maker(i, self._ended, self._calls)
                or numerics_locate.maker(path, self._calls))
        found = None
        if made != path or getattr(module, "composite", False):  # a hand-written loss
            module, args = self._calls[made]
            found = numerics_locate.watch_ops(module, args, self._autocast, self.dtype,
                                              input_range, first_nonfinite)
        if found is None:
            index, value = first_nonfinite(output)
            op = op_name(module, output) if made == path else ""
            inputs = input_ranges(module, args, self.dtype)
        else:
            op, index, value, inputs = found
        return FirstInvalid(self.step, "forward", made, op, index, value, self.fmt.name,
                            inputs, counts)


# NOTE [ Backward names ] in reference/numerics.py: what detect_anomaly checks and names.
_ANOMALY = re.compile(r"Function '(\w+)' returned nan values in its (\d+)th output")
_TRACEBACK = re.compile(r"Error detected in (\w+)\. Traceback of forward call that caused the "
                        r"error:\n(.*)", re.S)


class _Stop(Exception):
    """The replay ends before the optimizer."""


def anomaly_replay(model: nn.Module, loss_fn: nn.Module, step: Callable[[Callable], Any]
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
