"""Finding the first invalid value: per-step counts, the first non-finite op, anomaly replay.

A run that goes to NaN raises one question: which op, in which module, at which step, made
the first non-finite value, and was it forward or backward? The detector answers it from the
tape's hooks (reference/module.py: NOTE [ Hooks wrap forward and backward ]) and explains it
in terms of the number format.

Per-step counts. Each leaf module's output (its activation) and each parameter's gradient
gets one row of COLUMNS:

    nan, posinf, neginf     the non-finite values, by kind
    zero                    exact zeros (an underflowed gradient is a zero: not NaN)
    over_max                finite values that the view format's cast takes past its range
                            (to inf; to NaN or to +-max in a float8 without inf):
                            |x| >= max + ulp(max)/2   (float16: 65504 + 16 = 65520; the tie
                            goes to the even neighbour, which is inf: max's last bit is 1;
                            float8_e4m3fn's max 448 ends in 0, so 464 rounds to it and
                            only |x| > 464 counts: common.numerics_report.thresholds)
    to_zero                 non-zero finite values that the cast rounds to zero:
                            0 < |x| <= smallest_subnormal / 2   (float16: 2^-25; the tie
                            goes to the even neighbour, zero)

The view format is the run's autocast format, or float16 for an fp32 run ("what would this
step do in fp16"). Values already held in the format count 0 in the last two columns.

First invalid value in forward. The rows are taken in the order the hooks fire (the order
the ops ran); the first leaf output with a non-finite value is where the first invalid value
shows, and the module that made it is that leaf, or the innermost container around it whose
inputs were finite, with the op inside it found by a watched re-run (numerics_locate.py):

    FirstInvalid(step, phase="forward", module=<path; the model itself by its class, NOTE
                 [ The model's own name ]>, op=<torch's autograd node name>,
                 index=<first non-finite element, C order>, value="inf" | "-inf" | "nan",
                 inputs=(InputRange per input and own parameter: finite min/max, how many
                         non-finite, how many beyond the view format's range))

An input with a non-finite value or a value beyond the format's range was already out of
range when the op ran: a Linear whose weight holds 131072 overflows float16 at its cast, and
the report names the weight. Ops carry torch's autograd node names (OP_NAMES), so the two
trees' reports compare as strings.

Backward. A non-finite gradient with a loss scaler enabled is the scaler's business (the
step is skipped); without one it stops the run with phase "backward", naming the first
parameter (in backward order) whose gradient is non-finite. The node that made it is named
by the anomaly replay: the saved batch, model, scaler and random state re-run forward and
backward, and the first backward node returning NaN is named as torch's
detect_anomaly(check_nan=True) names it (NOTE [ Backward names ]).

The detector's control flow (the phases, the order of the search) is common/numerics_detect.py;
this module supplies the reference's calls. The torch twin is torch_impl/numerics.py.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from common import numerics_detect
from common.format_spec import FloatFormat, get_format
from common.fp8_train import autocast_precision
from common.numerics_report import (  # noqa: F401  (re-exported)
    COLUMNS,
    FirstInvalid,
    Found,
    InputRange,
    NonFinite,
    ReplayResult,
    format_counts,
    thresholds,
    totals,
)
from reference import amp, numerics_locate
from reference.module import (
    Module,
    Node,
    Parameter,
    register_module_forward_hook,
    register_module_full_backward_hook,
)
from reference.nn import CrossEntropyLoss

# torch's autograd node for each reference node's forward (grad_fn.name() of its output)
OP_NAMES = {"ReLU": "ReluBackward0", "Tanh": "TanhBackward0", "GELU": "GeluBackward0",
            "Dropout": "MulBackward0", "MSELoss": "MseLossBackward0",
            "CrossEntropyLoss": "NllLossBackward0", "NextTokenLoss": "NllLossBackward0",
            "LayerNorm": "NativeLayerNormBackward0", "Embedding": "EmbeddingBackward0"}


def op_name(node: Node) -> str:
    """torch's autograd node name for `node`'s output (Linear: addmm, or mm without bias)."""
    if type(node).__name__ == "Linear":
        return "AddmmBackward0" if node.bias is not None else "MmBackward0"  # type: ignore
    return OP_NAMES.get(type(node).__name__, type(node).__name__)


def view_format(precision: str) -> str:
    """The format the counts view values in: the autocast format, float16 for fp32 and for
    the scaled precisions (whose non-GEMM ops run in float32)."""
    return amp.autocast_dtype(autocast_precision(precision)) or "float16"


def count_rows(tensors: list[np.ndarray], fmt: FloatFormat) -> np.ndarray:
    """(len(tensors), COLUMNS) int64: one pass over the tensors' concatenation, each value's
    six indicators summed into its tensor's row."""
    with np.errstate(invalid="ignore"):  # a signalling NaN quiets: still a NaN
        x = np.concatenate([np.asarray(t, np.float64).reshape(-1) for t in tensors]
                           or [np.zeros(0)])  # (n,): every float32 value exactly
    segment = np.repeat(np.arange(len(tensors)), [np.size(t) for t in tensors])  # (n,)
    overflow, underflow = thresholds(fmt)
    finite, magnitude = np.isfinite(x), np.abs(x)
    masks = np.stack([np.isnan(x), np.isposinf(x), np.isneginf(x), x == 0,
                      finite & (magnitude >= overflow),
                      finite & (x != 0) & (magnitude <= underflow)], axis=1).astype(np.int64)
    rows = np.zeros((len(tensors), len(COLUMNS)), np.int64)
    np.add.at(rows, segment, masks)  # (tensors, COLUMNS)
    return rows


def first_nonfinite(x: np.ndarray) -> tuple[tuple[int, ...], str]:
    """(index, value) of the first non-finite element of x in C order."""
    x = np.asarray(x)
    flat = int(np.flatnonzero(~np.isfinite(x))[0])
    index = tuple(int(i) for i in np.unravel_index(flat, x.shape))
    return index, repr(float(x.reshape(-1)[flat]))


def input_range(name: str, x: np.ndarray, fmt: FloatFormat) -> InputRange:
    with np.errstate(invalid="ignore"):  # a signalling NaN quiets: still a NaN
        x = np.asarray(x, dtype=np.float64)
    finite = x[np.isfinite(x)]
    low, high = (None, None) if finite.size == 0 else (float(finite.min()), float(finite.max()))
    beyond = int((np.abs(finite) >= thresholds(fmt)[0]).sum())
    return InputRange(name, low, high, int(x.size - finite.size), beyond)


def input_ranges(node: Node, args: tuple, fmt: FloatFormat) -> tuple[InputRange, ...]:
    """The op's inputs: the call's arguments, then the node's own parameters."""
    names = ("input", "target") if len(args) == 2 else ("input",)
    ranges = [input_range(n, a, fmt) for n, a in zip(names, args, strict=False)
              if np.asarray(a).dtype.kind == "f"]
    params = node.named_parameters() if isinstance(node, Module) else ()  # a leaf's own
    return tuple(ranges + [input_range(n, p.data, fmt) for n, p in params])


def leaf_paths(model: Module, loss_fn: Node | None) -> dict[int, str]:
    """id -> path of every leaf module (no children) and of the loss ("loss"; a run of the
    transformer has none: the model's own `loss_fn` is its loss)."""
    paths = {id(m): path for path, m in model.named_modules() if len(list(m.modules())) == 1}
    loss_fn = loss_fn if loss_fn is not None else getattr(model, "loss_fn", None)
    return paths if loss_fn is None else {**paths, id(loss_fn): "loss"}


def all_paths(model: Module, loss_fn: Node | None) -> dict[int, str]:
    """id -> path of every module, containers too (numerics_locate climbs them)."""
    paths = {id(m): path for path, m in model.named_modules()}
    return {**paths, **leaf_paths(model, loss_fn)}


class Detector(numerics_detect.Detector):
    """common/numerics_detect.py's Detector (its docstring: the phases) on the tape's global
    forward hook: the reference's calls only."""

    locate = numerics_locate

    def __init__(self, model: Module, loss_fn: Node, fmt: str, *,
                 scaler_enabled: bool = False) -> None:
        super().__init__(model, get_format(fmt), all_paths(model, loss_fn),
                         set(leaf_paths(model, loss_fn)), scaler_enabled=scaler_enabled,
                         autocast=amp.autocast_state())

    def _register_forward_hook(self, hook: Callable[[Node, tuple, Any], None]) -> Any:
        return register_module_forward_hook(hook)

    def _autocast_state(self, output: Any) -> amp.AutocastState:
        return amp.autocast_state()  # one stack for every array: no device to ask

    def _grads(self) -> list[tuple[str, np.ndarray]]:
        return [(name, p.grad) for name, p in self.model.named_parameters()
                if p.grad is not None]

    def _register_grad_hooks(self, hook: Callable[[str, np.ndarray], None]
                             ) -> list[tuple[str, Any]]:
        return [(name, GradHook(p, functools.partial(hook, name)))
                for name, p in self.model.named_parameters()]

    def _count(self, tensors: list[np.ndarray]) -> list[list[int]]:
        return count_rows(tensors, self.fmt).tolist()

    def _op_name(self, node: Node, output: Any) -> str:
        return op_name(node)

    def _first_nonfinite(self, x: np.ndarray) -> tuple[tuple[int, ...], str]:
        return first_nonfinite(x)

    def _input_ranges(self, node: Node, args: tuple) -> tuple[InputRange, ...]:
        return input_ranges(node, args, self.fmt)

    def _watch_ops(self, node: Node, args: tuple) -> Found | None:
        return numerics_locate.watch_ops(node, args, self._autocast, self.fmt, input_range,
                                         first_nonfinite)

    def _made(self, *where: Any) -> FirstInvalid:
        report = super()._made(*where)
        return report if report.module else replace(report, module=model_name(self.model))


class GradHook:
    """torch's Tensor.register_hook on a parameter, for the reference: hook(g) with each
    gradient g a backward accumulates into `param`, before it is added (NOTE [ Counting the
    increment ] in common/numerics_detect.py); remove() unhooks. The reference's layers call
    Parameter.accumulate(g); the hook wraps that one parameter's, as torch keeps a tensor's
    hooks on the tensor."""

    def __init__(self, param: Parameter, hook: Callable[[np.ndarray], None]) -> None:
        self.param, self._before, self.active = param, vars(param).get("accumulate"), True
        accumulate = param.accumulate  # the class's, or an earlier hook's

        def hooked(grad: np.ndarray) -> None:
            if self.active:
                hook(grad)
            accumulate(grad)

        self._hooked = hooked
        param.accumulate = hooked  # type: ignore[method-assign]

    def remove(self) -> None:
        self.active = False
        if vars(self.param).get("accumulate") is not self._hooked:
            return  # removed already, or a later hook wraps this one (and calls this one on)
        if self._before is None:
            del self.param.accumulate
        else:
            self.param.accumulate = self._before  # type: ignore[method-assign]


# NOTE [ The model's own name ]
# A module's path is torch's (named_modules): "2", "transformer.h.0.attn.core"; the model
# itself, the root, has the empty path. An op written inline in the model's own forward
# (the transformer's tok + pos, the start of the residual stream) is made by the root, and a
# report "in ''" names nothing a reader can find. So where the maker is the root, the
# report names it by its class ("GPT"): the same in both trees, which build it under the
# same class names. The paths the detector climbs keep "" (numerics_locate.maker).


def model_name(model: Any) -> str:
    """How a report names the model itself (NOTE [ The model's own name ]): its class."""
    return type(model).__name__


# NOTE [ Backward names ]
# torch's detect_anomaly(check_nan=True) checks every backward node's outputs for NaN (not
# inf) and raises at the first node returning one: "Function 'AddmmBackward0' returned nan
# values in its 0th output.", with a warning carrying the forward call's traceback. The
# reference's backward hook checks the same thing after each node: the input gradient it
# returns and the gradients of its own parameters (torch's AddmmBackward0 returns those too).
# Two reference nodes are two torch nodes each: CrossEntropyLoss is log_softmax then
# nll_loss (NllLossBackward0 returns NaN only for a NaN incoming gradient; otherwise the
# NaN is LogSoftmaxBackward0's), and the loss's float32 cast under autocast
# (ToCopyBackward0) makes no NaN from a non-NaN value, so it is never named. A composite
# node (reference/faults.py's hand-written loss) records each of its torch nodes' outputs.
def backward_name(node: Node, grad_output: tuple) -> str:
    """torch's name of the backward node of `node` that returned the NaN."""
    stages = getattr(node, "backward_nodes", None)  # a composite's own stages, in order
    if stages is not None:
        return next(name for name, g in stages if np.isnan(g).any())
    if isinstance(node, CrossEntropyLoss):
        incoming = np.asarray(grad_output[0]) if grad_output else np.zeros(())
        return "NllLossBackward0" if np.isnan(incoming).any() else "LogSoftmaxBackward0"
    return op_name(node)


class _Found(Exception):
    def __init__(self, node: str, module: str) -> None:
        super().__init__(node)
        self.node, self.module = node, module


def anomaly_replay(model: Module, loss_fn: Node, step: Callable[[Callable], Any]) -> ReplayResult:
    """Run `step(phase)` (one train_step on the saved batch, stopped before the optimizer)
    with the backward check of NOTE [ Backward names ]; name the first NaN-returning node."""
    paths = leaf_paths(model, loss_fn)
    stacks: dict[str, str] = {}  # module path -> its forward call's traceback

    def forward_hook(node: Node, args: tuple, output: Any) -> None:
        if id(node) in paths:
            stacks[paths[id(node)]] = "".join(traceback.format_stack()[:-3])

    def backward_hook(node: Node, grad_input: Any, grad_output: tuple) -> None:
        if id(node) not in paths:
            return
        params = node.named_parameters() if isinstance(node, Module) else ()  # a leaf's own
        outputs = [grad_input] + [p.grad for _, p in params if p.grad is not None]
        if any(np.isnan(g).any() for g in outputs  # an Embedding returns no input gradient
               if numerics_locate.is_float(g)):
            raise _Found(backward_name(node, grad_output), paths[id(node)])

    @contextmanager
    def stop_before_optimizer(name: str) -> Iterator[None]:
        if name == "optimizer":
            raise _Stop
        yield

    handles = [register_module_forward_hook(forward_hook),
               register_module_full_backward_hook(backward_hook)]
    try:
        step(stop_before_optimizer)
    except _Found as found:
        return ReplayResult(found.node, found.module, stacks.get(found.module, ""))
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return ReplayResult(None, None, "")


class _Stop(Exception):
    """The replay ends before the optimizer."""
