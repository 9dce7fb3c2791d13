"""Which op made the first invalid value: the module that made it, and the op inside it.

The detector (reference/numerics.py) sees module outputs. The first leaf module whose output
holds a non-finite value is where the value first SHOWS; it was MADE there only if that
leaf's inputs were finite. A leaf fed a non-finite input (the attention core's dropout,
handed softmax's NaN) only passes it on: the value was made by its parent's own ops, between
its children (the core's q k^T, scaling, masking and softmax). So:

    maker = the leaf itself if its float inputs are finite (or nothing above it has finite
            inputs: the value came with the data); otherwise the innermost module around it
            whose float inputs are all finite
    op    = a leaf maker's own op (numerics.op_name); for a container, the first op inside
            it whose output holds a non-finite value while every input, tensors and scalars,
            is finite: a value an op was TOLD to write (masked_fill's -inf) is not invalid,
            and an op fed an invalid value did not make it

Finding a container's op re-runs its forward on the recorded inputs, under the step's
autocast state, with its ops watched; only on the step that found a value, never on a clean
one. The re-run leaves nothing behind: the dropout generators are restored, the tape the
re-run recorded is dropped. The reference watches the op functions (reference/layers.py)
that the container's module imported, under torch's autograd node names and argument
names (OPS), so the two trees' reports compare as strings. An op written inline in the
container's own forward (the residual `x + y`) is a NumPy ufunc: the re-run hands the
container its inputs, and its children's outputs, as a watched array (_Inline), whose ufuncs
in the container's own body (not inside a child module or an op function) are checked the
same way, under torch's node names (UFUNCS: np.add is AddBackward0).

A value made by an inline op at the end of a container (block 0's second residual add)
shows in no leaf of that container: the first leaf to show it is the next block's ln_1,
none of whose parents has finite inputs. So before climbing, the detector looks at the
containers that ended before that leaf ran (their outputs are kept for the step): the first
with a non-finite output and finite inputs made it (`ended_maker`).
The torch twin is torch_impl/numerics_locate.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from common.format_spec import FloatFormat
from common.numerics_report import Found, InputRange
from reference import amp
from reference.module import (
    INPUT_DTYPES,
    Module,
    Node,
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

# reference/layers.py's op functions: torch's autograd node and the aten op's argument names
OPS = {"bmm": ("BmmBackward0", ("self", "mat2")),
       "scale": ("MulBackward0", ("self", "other")),
       "masked_fill": ("MaskedFillBackward0", ("self", "mask", "value")),
       "softmax": ("SoftmaxBackward0", ("self",)),
       "layer_norm": ("NativeLayerNormBackward0", ("input", "weight", "bias", "eps")),
       "embedding": ("EmbeddingBackward0", ("weight", "indices")),
       "log": ("LogBackward0", ("self",))}


def finite(values: tuple) -> bool:
    """Every float array and float scalar among `values` is finite."""
    with np.errstate(invalid="ignore"):
        return all(bool(np.isfinite(np.asarray(v, np.float64)).all()) for v in values
                   if isinstance(v, float) or is_float(v))


def is_float(v: Any) -> bool:
    """A float array: float32/64 or the 2-byte ones autocast makes (ml_dtypes' kind is "V")."""
    return isinstance(v, np.ndarray) and v.dtype in INPUT_DTYPES


def ended_maker(before: int, ended: list[tuple[int, str, Any]],
                calls: dict[str, tuple[Node, tuple]]) -> str | None:
    """The first container that ended before leaf number `before` ran (`ended`: (leaves
    recorded when it ended, path, output), in the order they ended) with a non-finite output
    and finite inputs: an inline op in it made the value no leaf of it shows. None if none."""
    for seen, path, output in ended:
        if seen > before:
            break
        if not finite((output,)) and finite(calls[path][1]):
            return path
    return None


def maker(path: str, calls: dict[str, tuple[Node, tuple]]) -> str:
    """The path of the module that made the first invalid value first shown by leaf `path`
    (`calls`: path -> (module, args) of every module called in the step's forward)."""
    if finite(calls[path][1]):
        return path
    parts = path.split(".")
    for n in range(len(parts) - 1, -1, -1):  # the parents, innermost first; "" is the root
        parent = ".".join(parts[:n])
        if parent in calls and finite(calls[parent][1]):
            return parent
    return path


# the ufuncs an inline op calls: torch's autograd node and the aten op's argument names
UFUNCS = {np.add: ("AddBackward0", ("self", "other")),
          np.subtract: ("SubBackward0", ("self", "other")),
          np.multiply: ("MulBackward0", ("self", "other")),
          np.true_divide: ("DivBackward0", ("self", "other"))}


def watch_ops(node: Module, args: tuple, state: amp.AutocastState, fmt: FloatFormat,
              ranges: Callable[[str, np.ndarray, FloatFormat], InputRange],
              first: Callable[[np.ndarray], tuple[tuple[int, ...], str]]) -> Found | None:
    """Re-run `node.forward(*args)` under `state` with its module's op functions watched:
    (op, index and value of its first non-finite element, its inputs' ranges) of the first
    op that made a non-finite value from finite inputs, or None."""
    namespace = sys.modules[type(node).__module__]
    found: list[Found] = []
    depth = [0]  # modules entered: 1 is the container's own body

    def check(op: str, names: tuple[str, ...], a: tuple, out: Any) -> None:
        if not found and finite(a) and not finite((out,)):
            inputs = tuple(ranges(n, np.asarray(v), fmt) for n, v in zip(names, a, strict=False)
                           if is_float(np.asarray(v)) and np.ndim(v) > 0)
            found.append((op, *first(np.asarray(out)), inputs))

    def watched(function: Callable[..., Any], op: str, names: tuple[str, ...]
                ) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            depth[0] += 1  # its own ufuncs are its business, not inline ops
            try:
                result = function(*a)
            finally:
                depth[0] -= 1
            check(op, names, a, result[0] if isinstance(result, tuple) else result)
            return result
        return run

    class _Inline(np.ndarray):
        """An array of the container's body: its ufuncs there are watched (UFUNCS)."""

        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any
                            ) -> Any:
            plain = tuple(i.view(np.ndarray) if isinstance(i, _Inline) else i for i in inputs)
            result = getattr(ufunc, method)(*plain, **kwargs)
            if method != "__call__" or ufunc not in UFUNCS or depth[0] != 1:
                return result
            check(*UFUNCS[ufunc], plain, result)
            return result.view(_Inline) if isinstance(result, np.ndarray) else result

    def enter(n: Node, a: tuple) -> None:
        depth[0] += 1

    def leave(n: Node, a: tuple, out: Any) -> None:
        depth[0] -= 1

    originals = {name: getattr(namespace, name) for name in OPS if hasattr(namespace, name)}
    generators = {id(m.rng): m.rng for m in (node.modules() if isinstance(node, Module)
                                             else (node,))
                  if isinstance(getattr(m, "rng", None), np.random.Generator)}
    states = {k: g.bit_generator.state for k, g in generators.items()}
    def inline_output(module: Node) -> Callable[..., Any]:
        original = module.forward  # the hooked forward, bound

        def forward(*a: Any) -> Any:
            out = original(*a)
            return out.view(_Inline) if is_float(out) else out
        return forward

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    inline = tuple(a.view(_Inline) if is_float(a) else a for a in args)
    children = [m for m in node.modules() if m is not node] if isinstance(node, Module) else []
    try:
        for m in children:  # an instance attribute: the children's outputs are watched too
            m.forward = inline_output(m)  # type: ignore[method-assign]
        for name, function in originals.items():
            setattr(namespace, name, watched(function, *OPS[name]))
        with amp.autocast.entering(state), np.errstate(all="ignore"):
            node.forward(*inline)
    finally:
        for m in children:
            m.__dict__.pop("forward", None)
        for h in handles:
            h.remove()
        for name, function in originals.items():
            setattr(namespace, name, function)
        for k, g in generators.items():
            g.bit_generator.state = states[k]
        node.free_saved()
    return found[0] if found else None
