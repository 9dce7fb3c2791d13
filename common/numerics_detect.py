"""The numerics detector's control flow, once: what it records in a micro-step's forward,
what it takes from the backward that follows, how it counts each micro-step into rows, how
it picks the first invalid value and locates where it was made. The counts, the report and
the search are stated in reference/numerics.py; this module holds only the order of things,
which does not depend on the library.

A step is one or more micro-steps (gradient accumulation: k forwards and backwards, one
update), then `end_step`, before the optimizer updates:

    micro_step()       a context around one micro-step's forward: counts the micro-step
                       before it (if any), forgets its records, and registers a global
                       forward hook (removed when the context ends) that records every
                       leaf's output in op order, every module's first call, each
                       container's end, and the autocast state at the first call. The
                       step's first micro-step also registers a hook on every parameter that
                       keeps each gradient backward accumulates into it (the increment, not
                       the sum: NOTE [ Counting the increment ]); the backward runs after
                       the context (a forward recomputed in backward is not recorded)
    end_step(scaler=None, grad_norm=None)
                       counts the last micro-step, removes the parameter hooks, appends the
                       step's rows summed over its micro-steps to `history`, and returns or
                       raises the step's first invalid value (below); advances `step`

Each micro-step is counted when the next begins or the step ends: its leaves' outputs and
its gradient increments into rows (`micro_counts`, the step's, one dict per micro-step),
and, until one is found, the first invalid value, in order: the first leaf output with a
non-finite count (forward; where it was made: `_made`); else the last parameter (the first
in backward order) whose increment has one (backward). At `end_step`, with a scaler enabled
a backward one is reported, not raised: the scaler skips the step (the report is returned
and kept in `skipped`); anything else raises NonFinite (a forward overflow: scaling the
loss does not reach the forward, so the scaler would skip the step again and again). A
`grad_norm` (clip_grad_norm_'s return: the norm before clipping) that is not finite when no
increment was raises too: the finite increments overflowed as they were summed.

`phase(name)` is train_step's protocol, one micro-step a step: "forward" is micro_step(),
"backward" nothing, "optimizer" end_step() (with the scaler state given at construction);
its gradient rows are .grad as the optimizer phase finds it (NOTE [ One micro-step from
zero ]).

Each tree's Detector subclasses this one and supplies only the library calls: how a global
forward hook and the parameters' gradient hooks are registered, how the autocast state is
read, how tensors are counted into rows, and the op name, first non-finite element and
input ranges of its values; `locate` is the tree's numerics_locate module (ended_maker,
maker).
"""

# NOTE [ One micro-step from zero ]
# `phase` is train_step's protocol: one micro-step, the gradients set to None in its forward
# phase, so the gradients the optimizer phase finds in .grad are that micro-step's own, and
# it counts them there, as they stand when the update begins (no hook: what a test or a
# fault writes into .grad between backward and update is counted). A step of micro_step()
# calls counts what each backward added (NOTE [ Counting the increment ]).

# NOTE [ Counting the increment ]
# With k micro-steps a parameter's .grad holds the sum of k gradients; an inf in micro-step
# 1 is still inf (or NaN) in the sum, but the sum cannot say which micro-step made it, and
# an unscale_ or a clip_grad_norm_ rewrites .grad in place before the step ends (a clip with
# an inf norm multiplies by 0: the inf becomes NaN, every finite value 0). So each
# gradient is kept as backward hands it to the parameter, before it is added (torch's
# Tensor.register_hook on a leaf; the reference's Parameter.accumulate): its own array, which
# an unscale_ or a clip of .grad does not touch (torch copies into .grad a gradient that a
# hook still holds). A parameter whose gradient arrives twice in one backward (a reentrant
# recomputation) is counted as the sum of the two, as .grad adds them. The increments are
# held until the micro-step is counted: one gradient's worth of memory.

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from types import ModuleType
from typing import Any

from common.numerics_report import FirstInvalid, Found, InputRange, NonFinite


class Detector:
    """Counts and the first invalid value of each micro-step and step (module docstring:
    micro_step, end_step; `phase` is train_step's `phase`)."""

    locate: ModuleType  # the tree's numerics_locate: ended_maker, maker

    def __init__(self, model: Any, fmt: Any, paths: dict[int, str], leaves: set[int], *,
                 scaler_enabled: bool, autocast: Any) -> None:
        self.model, self.fmt, self.scaler_enabled = model, fmt, scaler_enabled
        self.paths, self.leaves = paths, leaves  # every module's id -> path; the leaves' ids
        self.step = 0  # the step the next micro-steps belong to; end_step advances it
        self.history: list[dict[str, list[int]]] = []  # a dict a step: rows summed over
        self.micro_counts: list[dict[str, list[int]]] = []  # this step's: one a micro-step
        self.skipped: list[FirstInvalid] = []  # the steps a scaler skipped, each its report
        self._seen: list[tuple[str, Any, tuple, Any]] = []  # leaves, in op order
        self._calls: dict[str, tuple[Any, tuple]] = {}  # every module: its first call's
        self._ended: list[tuple[int, str, Any]] = []  # containers: (leaves before, path, output)
        self._autocast = autocast  # the forward's, for numerics_locate's re-run
        self._open = False  # a step has begun (a micro-step) and not ended
        self._hooked = True  # its gradients from the hooks (micro_step) or .grad (phase)
        self._grad_hooks: list[tuple[str, Any]] = []  # (name, handle), in parameter order
        self._increments: dict[str, Any] = {}  # this micro-step's gradients, by parameter
        self._uncounted = False  # a micro-step ran that is not counted yet
        self._found: FirstInvalid | None = None  # the step's first invalid value so far

    # the library calls: each tree's Detector supplies these
    def _register_forward_hook(self, hook: Callable[[Any, tuple, Any], None]) -> Any:
        """A global forward hook on every module; the handle's remove() unregisters it."""
        raise NotImplementedError

    def _register_grad_hooks(self, hook: Callable[[str, Any], None]) -> list[tuple[str, Any]]:
        """hook(name, g) for each gradient g backward accumulates into a parameter, before it
        is added: (name, handle) of every parameter in parameter order; remove() unhooks."""
        raise NotImplementedError

    def _grads(self) -> list[tuple[str, Any]]:
        """(name, .grad) of every parameter that has one, in parameter order."""
        raise NotImplementedError

    def _autocast_state(self, output: Any) -> Any | None:
        """The autocast state in force for `output`'s op (None: unknown, keep the last)."""
        raise NotImplementedError

    def _count(self, tensors: list[Any]) -> list[list[int]]:
        """(len(tensors), COLUMNS) counts, on the host."""
        raise NotImplementedError

    def _op_name(self, node: Any, output: Any) -> str:
        raise NotImplementedError

    def _first_nonfinite(self, x: Any) -> tuple[tuple[int, ...], str]:
        raise NotImplementedError

    def _input_ranges(self, node: Any, args: tuple) -> tuple[InputRange, ...]:
        raise NotImplementedError

    def _watch_ops(self, node: Any, args: tuple) -> Found | None:
        """numerics_locate.watch_ops on `node(*args)` under the forward's autocast state."""
        raise NotImplementedError

    # the control flow
    def micro_step(self) -> AbstractContextManager[None]:
        """Around one micro-step's forward; its backward follows the context."""
        return self._micro_step(hooked=True)

    @contextmanager
    def _micro_step(self, *, hooked: bool) -> Iterator[None]:
        self._count_micro_step()
        if not self._open:  # the step's first micro-step
            self.micro_counts, self._found = [], None
            self._open, self._hooked = True, hooked
            self._grad_hooks = self._register_grad_hooks(self._grad_hook) if hooked else []
        self._seen, self._calls, self._ended = [], {}, []
        self._uncounted = True
        handle = self._register_forward_hook(self._forward_hook)
        try:
            yield
        except BaseException:
            self._uncounted = False  # the caller's own error: no hook outlives it
            self._close_step()
            raise
        finally:
            handle.remove()

    def end_step(self, scaler: Any = None, grad_norm: Any = None) -> FirstInvalid | None:
        """The step's end, before the optimizer updates (module docstring): None for a
        clean step, the report of a step the scaler skips; NonFinite for anything else.
        `scaler` (its is_enabled(), get_scale()) overrides the constructor's
        scaler_enabled; `grad_norm` is clip_grad_norm_'s return, the norm before clipping."""
        self._count_micro_step()
        self._close_step()
        counts: dict[str, list[int]] = {}
        for micro in self.micro_counts:  # the step's rows: each summed over micro-steps
            for name, row in micro.items():
                counts[name] = [a + b for a, b in zip(counts.get(name, [0] * len(row)), row,
                                                       strict=True)]
        self.history.append(counts)
        scaling = self.scaler_enabled if scaler is None else bool(scaler.is_enabled())
        norm = None if grad_norm is None else float(grad_norm)
        found = self._found
        skippable = found is not None and found.phase == "backward"  # a counted gradient's
        if found is None and norm is not None and not math.isfinite(norm):
            found = FirstInvalid(self.step, "backward", "grad_norm", "", (), repr(norm),
                                 self.fmt.name, micro_step=max(len(self.micro_counts) - 1, 0))
        if found is None:
            self.step += 1
            return None
        found = replace(found, micro_steps=max(len(self.micro_counts), 1), counts=counts,
                        grad_norm=norm)
        if not (scaling and skippable):
            raise NonFinite(found)
        found = replace(found, skipped=True, scale=None if scaler is None
                        else float(scaler.get_scale()))
        self.skipped.append(found)
        self.step += 1
        return found

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "forward":  # NOTE [ One micro-step from zero ]
            with self._micro_step(hooked=False):
                yield
            return
        if name == "optimizer":
            self.end_step()
        yield

    def ops(self) -> list[tuple[str, str]]:
        """(module path, op) of every leaf output recorded in the last micro-step, in op
        order."""
        return [(path, self._op_name(node, output)) for path, node, _, output in self._seen]

    def _forward_hook(self, node: Any, args: tuple, output: Any) -> None:
        path = self.paths.get(id(node))
        if path is None:
            return
        if not self._calls and (state := self._autocast_state(output)) is not None:
            self._autocast = state
        self._calls.setdefault(path, (node, args))
        if id(node) in self.leaves:
            self._seen.append((path, node, args, output))
        else:  # a container: where an inline op's value ends (numerics_locate.ended_maker)
            self._ended.append((len(self._seen), path, output))

    def _grad_hook(self, name: str, grad: Any) -> None:
        """NOTE [ Counting the increment ]: this micro-step's gradient of `name`."""
        held = self._increments.get(name)
        self._increments[name] = grad if held is None else held + grad

    def _close_step(self) -> None:
        for _, handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks, self._open = [], False

    def _count_micro_step(self) -> None:
        """The last micro-step's rows; its first invalid value, if the step has none yet."""
        if not self._uncounted:
            return
        self._uncounted = False
        order = [name for name, _ in self._grad_hooks]
        grads = ([(name, self._increments[name]) for name in order if name in self._increments]
                 if self._hooked else self._grads())
        self._increments = {}
        tensors = [output for *_, output in self._seen] + [g for _, g in grads]
        table = self._count(tensors)  # (leaves + parameters, COLUMNS)
        names = [f"act:{path}" for path, *_ in self._seen] + [f"grad:{n}" for n, _ in grads]
        counts = dict(zip(names, table, strict=True))
        self.micro_counts.append(counts)
        if self._found is None and (found := self._first_invalid(table, grads, counts)):
            self._found = replace(found, micro_step=len(self.micro_counts) - 1)

    def _first_invalid(self, table: list[list[int]], grads: list[tuple[str, Any]],
                       counts: dict[str, list[int]]) -> FirstInvalid | None:
        if not any(row[0] or row[1] or row[2] for row in table):  # a clean step: at once
            return None
        for i, ((path, node, args, output), row) in enumerate(zip(self._seen, table,
                                                                    strict=False)):
            if sum(row[:3]):
                return self._made(i, path, node, args, output, counts)
        for (name, grad), row in reversed(list(zip(grads, table[len(self._seen):],
                                                   strict=True))):
            if sum(row[:3]):
                index, value = self._first_nonfinite(grad)
                return FirstInvalid(self.step, "backward", name, "", index, value,
                                    self.fmt.name, (), counts)
        return None
    def _made(self, i: int, path: str, node: Any, args: tuple, output: Any,
              counts: dict[str, list[int]]) -> FirstInvalid:
        """The report of the first invalid value, first shown by leaf `path`: where it was
        made (reference/numerics_locate.py)."""
        made = (self.locate.ended_maker(i, self._ended, self._calls)
                or self.locate.maker(path, self._calls))
        found = None
        if made != path or getattr(node, "composite", False):  # a hand-written loss
            node, args = self._calls[made]
            found = self._watch_ops(node, args)
        if found is None:
            index, value = self._first_nonfinite(output)
            op = self._op_name(node, output) if made == path else ""
            inputs = self._input_ranges(node, args)
        else:
            op, index, value, inputs = found
        return FirstInvalid(self.step, "forward", made, op, index, value, self.fmt.name,
                            inputs, counts)
