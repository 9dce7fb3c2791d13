"""Activation checkpointing with torch.utils.checkpoint. See reference/recompute.py for the math.

What PyTorch does differently or hides:
- `checkpoint(fn, x, use_reentrant=False)` (used here, explicitly) saves the segment's inputs
  through a no-op autograd Function (`_NoopSaveInputs`) and runs the segment under its own
  `saved_tensors_hooks`, which keep a placeholder instead of each tensor; an OUTER
  `saved_tensors_hooks` therefore sees exactly what the region keeps: its input (the
  0-element dummy the Function also takes is not packed). Backward recomputes on the first
  unpack of a placeholder.
- Early stop (NOTE [ Early stop ]): the non-reentrant recompute raises an internal exception
  as soon as it has re-saved as many tensors as the forward saved, so a segment's last layer
  starts (its forward pre-hook fires) but never returns (its forward hook does not), and
  trailing layers that save nothing are not run at all.
- `use_reentrant=True` is the older autograd.Function that runs the segment under no_grad and
  re-enters autograd (`torch.autograd.backward`) inside its own backward: no early stop, no
  nesting of schedules' inner checkpoints into the outer graph, and if no input requires grad
  its output does not either, so the parameters inside get NO gradient (torch only warns
  "None of the inputs have requires_grad=True"). Non-reentrant has none of these traps.
- The RNG replay (NOTE [ RNG replay ] in reference/recompute.py) stashes the global CPU RNG
  (and each used CUDA device's) at forward and runs the recompute inside `fork_rng` with it;
  nn.Dropout draws from that global generator.
- `parse_schedule` is this tree's own: the optimal split comes from Griewank and Walther's
  binomial formula (NOTE [ Revolve counting ]), not a search; plans are the reference's plain
  data (`Schedule`, `Segment`), so both trees' plans compare with ==.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential

from reference.recompute import Schedule, Segment  # plain data: the plan's shape

SPECS = ("none", "sqrt", "uniform:K", "optimal:S")


def _parse_int(spec: str, what: str) -> int:
    head, _, value = spec.partition(":")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"parse_schedule: {head}:{what} needs an integer {what}, "
                         f"got {spec!r}") from None


def parse_schedule(spec: str, n_layers: int) -> Schedule:
    """The plan for "none", "sqrt", "uniform:K" (1 <= K <= n) or "optimal:S" (S >= 1)."""
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"parse_schedule: n_layers must be a positive int, got {n_layers!r}")
    if spec == "none":
        return Schedule(spec, n_layers, tuple(range(n_layers)))
    if spec == "sqrt":
        return Schedule(spec, n_layers, uniform_plan(n_layers, max(1, round(math.sqrt(n_layers)))))
    if spec.startswith("uniform:"):
        k = _parse_int(spec, "K")
        if not 1 <= k <= n_layers:
            raise ValueError(f"parse_schedule: uniform:K needs 1 <= K <= {n_layers} (the number "
                             f"of layers), got K = {k}")
        return Schedule(spec, n_layers, uniform_plan(n_layers, k))
    if spec.startswith("optimal:"):
        s = _parse_int(spec, "S")
        if s < 1:
            raise ValueError(f"parse_schedule: optimal:S needs S >= 1 checkpoint slot (the "
                             f"input's), got S = {s}")
        return Schedule(spec, n_layers, revolve_plan(0, n_layers, s), s)
    raise ValueError(f"parse_schedule: unknown schedule {spec!r}; accepted: {', '.join(SPECS)}")


def uniform_plan(n: int, k: int) -> tuple[int | Segment, ...]:
    """checkpoint_sequential(functions, k)'s segments: k - 1 checkpoints of n // k layers."""
    size = n // k
    plan: list[int | Segment] = [Segment(s, s + size, tuple(range(s, s + size)))
                                 for s in range(0, size * (k - 1), size)]
    return (*plan, *range(size * (k - 1), n))


def _beta(c: int, r: int) -> int:
    return math.comb(c + r, c) if r >= 0 else 0


def revolve_split(length: int, slots: int) -> int:
    """The largest optimal first checkpoint distance: min(beta(c, r-1), l - beta(c-1, r-1))."""
    r = 0
    while _beta(slots, r) < length:
        r += 1
    return min(_beta(slots, r - 1), length - _beta(slots - 1, r - 1))


def revolve_plan(i: int, j: int, slots: int) -> tuple[int | Segment, ...]:
    """NOTE [ Revolve counting ] (reference/recompute.py): layers i..j-1 with `slots` slots."""
    if j - i == 1:
        return (i,)
    m = i + revolve_split(j - i, slots)
    return (Segment(i, m, revolve_plan(i, m, slots)), *revolve_plan(m, j, slots - 1))


def _run_plan(layers: Sequence[nn.Module], plan: Sequence[int | Segment], x: torch.Tensor,
              use_reentrant: bool, preserve_rng_state: bool) -> torch.Tensor:
    for item in plan:
        if isinstance(item, int):
            x = layers[item](x)
            continue

        def segment(h: torch.Tensor, body: tuple = item.body) -> torch.Tensor:
            return _run_plan(layers, body, h, use_reentrant, preserve_rng_state)

        x = torch_checkpoint(segment, x, use_reentrant=use_reentrant,
                             preserve_rng_state=preserve_rng_state)
    return x


def forward_with_schedule(model: nn.Sequential, x: torch.Tensor, schedule: Schedule | str, *,
                          use_reentrant: bool = False, preserve_rng_state: bool = True
                          ) -> torch.Tensor:
    """model(x) with the schedule's segments wrapped in torch.utils.checkpoint.checkpoint.

    Returns the output; autograd's backward does the recomputation. Uniform schedules go
    through torch's own checkpoint_sequential, so its segment rule is exercised as written.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"forward_with_schedule: model must be a torch.nn.Sequential, "
                        f"got {type(model).__name__}")
    if isinstance(schedule, str):
        schedule = parse_schedule(schedule, len(model))
    if schedule.n_layers != len(model):
        raise ValueError(f"forward_with_schedule: schedule {schedule.spec!r} is for "
                         f"{schedule.n_layers} layers, the model has {len(model)}")
    if schedule.spec.startswith("uniform:"):
        return checkpoint_sequential(model, int(schedule.spec.partition(":")[2]), x,
                                     use_reentrant=use_reentrant,
                                     preserve_rng_state=preserve_rng_state)
    return _run_plan(list(model), schedule.plan, x, use_reentrant, preserve_rng_state)


def checkpoint(segment: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *,
               use_reentrant: bool = False, preserve_rng_state: bool = True) -> torch.Tensor:
    """torch.utils.checkpoint.checkpoint with use_reentrant stated (False unless told)."""
    return torch_checkpoint(segment, x, use_reentrant=use_reentrant,
                            preserve_rng_state=preserve_rng_state)


def checkpoint_sequential(model: nn.Sequential, segments: int, x: torch.Tensor, *,
                          use_reentrant: bool = False, preserve_rng_state: bool = True
                          ) -> torch.Tensor:
    """torch.utils.checkpoint.checkpoint_sequential, with the segment count validated first."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"checkpoint_sequential: model must be a torch.nn.Sequential, "
                        f"got {type(model).__name__}")
    if not isinstance(segments, int) or not 1 <= segments <= len(model):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(model)}] (the "
                         f"number of layers), got {segments!r}")
    return torch_checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant,
                                       preserve_rng_state=preserve_rng_state)


# NOTE [ Early stop ]
# torch.utils.checkpoint (non-reentrant) counts the tensors a segment saved in forward; in the
# recompute, once that many are saved again it raises _StopRecomputationError from inside the
# pack hook, abandoning the rest of the forward. The segment's last saving layer is interrupted
# in the middle (after its saves: for Linear, before the matmul even runs, because addmm saves
# its inputs first), so counting layer forwards by forward hooks (post) misses one per
# recompute, while forward pre-hooks count every layer started. The reference recompute runs
# whole layers and also stops after the last layer that saves (early_stop=True), so its counts
# equal torch's pre-hook counts. torch.utils.checkpoint.set_checkpoint_early_stop(False) turns
# it off: then post-hook counts equal pre-hook counts.
@dataclass
class Measurement:
    """What one scheduled forward + backward did, measured with hooks.

    held: (data_ptr, nbytes, is_parameter) of every tensor the outer saved_tensors_hooks saw
    packed during forward; held_bytes: the distinct non-parameter bytes among them;
    started / finished: layer index -> forwards during backward, from forward pre-hooks and
    forward (post) hooks.
    """

    output: torch.Tensor
    held: list[tuple[int, int, bool]]
    held_bytes: int
    started: dict[int, int] = field(default_factory=dict)
    finished: dict[int, int] = field(default_factory=dict)
    grad_input: torch.Tensor | None = None


def measure(model: nn.Sequential, x: torch.Tensor, grad_output: torch.Tensor,
            schedule: Schedule | str, *, use_reentrant: bool = False,
            preserve_rng_state: bool = True) -> Measurement:
    """forward_with_schedule + backward(grad_output), with saved-tensor and forward hooks.

    `x` is used as given (it is not made to require grad: that is the caller's choice, and
    the reentrant fault depends on it).
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held: list[tuple[int, int, bool]] = []
    phase = ["forward"]
    counts: dict[str, dict[int, int]] = {"started": {}, "finished": {}}
    handles = []
    for index, layer in enumerate(model):
        def pre(mod: nn.Module, args: tuple, index: int = index) -> None:
            if phase[0] == "backward":
                counts["started"][index] = counts["started"].get(index, 0) + 1

        def post(mod: nn.Module, args: tuple, out: torch.Tensor, index: int = index) -> None:
            if phase[0] == "backward":
                counts["finished"][index] = counts["finished"].get(index, 0) + 1

        handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]

    def pack(t: torch.Tensor) -> torch.Tensor:
        is_param = t.untyped_storage().data_ptr() in param_ptrs
        held.append((t.data_ptr(), t.numel() * t.element_size(), is_param))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = forward_with_schedule(model, x, schedule, use_reentrant=use_reentrant,
                                      preserve_rng_state=preserve_rng_state)
        phase[0] = "backward"
        if y.requires_grad:
            y.backward(grad_output)
    finally:
        for h in handles:
            h.remove()
    distinct = {(ptr, nbytes) for ptr, nbytes, is_param in held if nbytes and not is_param}
    n = len(model)
    return Measurement(y.detach(), held, sum(nbytes for _, nbytes in distinct),
                       {i: counts["started"].get(i, 0) for i in range(n)},
                       {i: counts["finished"].get(i, 0) for i in range(n)}, x.grad)
