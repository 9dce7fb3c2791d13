"""The numerics detector's control flow, once: what it records in a step's forward, how it
counts the step into rows, how it picks the first invalid value and locates where it was
made. The counts, the report and the search are stated in reference/numerics.py; this
module holds only the order of things, which does not depend on the library.

    phase("forward")   begins the step: forgets the last one's records and registers a
                       global forward hook (removed when the phase ends) that records
                       every leaf's output in op order, every module's first call, each
                       container's end, and the autocast state at the step's first call
    phase("backward")  stops recording (a recomputed forward is not counted twice)
    phase("optimizer") counts the activations and gradients into rows, appends the step's
                       rows to `history`, and raises NonFinite at the first invalid value
                       (before the update)

The first invalid value, in order: the first leaf output with a non-finite count (forward;
where it was made: `_made`); else, with a loss scaler enabled, nothing (the scaler skips the
step); else the last parameter (the first in backward order) whose gradient has one.

Each tree's Detector subclasses this one and supplies only the library calls: how a global
forward hook is registered, how the autocast state is read, how the gradients are listed,
how tensors are counted into rows, and the op name, first non-finite element and input
ranges of its values; `locate` is the tree's numerics_locate module (ended_maker, maker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from common.numerics_report import FirstInvalid, Found, InputRange, NonFinite


class Detector:
    """Counts and the first invalid value of each step; `phase` is train_step's `phase`
    (module docstring: the phase table)."""

    locate: ModuleType  # the tree's numerics_locate: ended_maker, maker

    def __init__(self, model: Any, fmt: Any, paths: dict[int, str], leaves: set[int], *,
                 scaler_enabled: bool, autocast: Any) -> None:
        self.model, self.fmt, self.scaler_enabled = model, fmt, scaler_enabled
        self.paths, self.leaves = paths, leaves  # every module's id -> path; the leaves' ids
        self.step = 0  # set by the run loop before each step
        self.history: list[dict[str, list[int]]] = []
        self._seen: list[tuple[str, Any, tuple, Any]] = []  # leaves, in op order
        self._calls: dict[str, tuple[Any, tuple]] = {}  # every module: its first call's
        self._ended: list[tuple[int, str, Any]] = []  # containers: (leaves before, path, output)
        self._autocast = autocast  # the forward's, for numerics_locate's re-run

    # the library calls: each tree's Detector supplies these
    def _register_forward_hook(self, hook: Callable[[Any, tuple, Any], None]) -> Any:
        """A global forward hook on every module; the handle's remove() unregisters it."""
        raise NotImplementedError

    def _autocast_state(self, output: Any) -> Any | None:
        """The autocast state in force for `output`'s op (None: unknown, keep the last)."""
        raise NotImplementedError

    def _grads(self) -> list[tuple[str, Any]]:
        """(name, gradient) of every parameter that has one, in parameter order."""
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
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "forward":
            self._seen, self._calls, self._ended = [], {}, []
            handle = self._register_forward_hook(self._forward_hook)
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

    def _end_step(self) -> None:
        grads = self._grads()
        tensors = [output for *_, output in self._seen] + [g for _, g in grads]
        table = self._count(tensors)  # (leaves + parameters, COLUMNS)
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
        for i, ((path, node, args, output), row) in enumerate(zip(self._seen, table,
                                                                    strict=False)):
            if sum(row[:3]):
                return self._made(i, path, node, args, output, counts)
        if self.scaler_enabled:  # the scaler skips this step
            return None
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
