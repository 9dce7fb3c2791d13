"""The training-loop faults investigated: an `.item()` inside the step, a graph break under
torch.compile, and a checkpoint with a state entry dropped. As postmortem_amp.py: each runs
the seeded loop and the repaired one, measures, and returns a Postmortem whose verdicts are
computed from the numbers.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from parity.lab.runners.postmortem_record import Hypothesis, Postmortem

# ---------------------------------------------------------------- .item() inside the step

SYNC_STEPS = 3
EARLY = ("forward", "backward")  # where no host read belongs: the device still has work


def sync_loop(seeded: bool) -> dict[str, dict[str, int]]:
    """SYNC_STEPS fp32 steps of the default MLP (torch_impl.train.Run), counting by phase the
    host reads of a tensor's value (aten._local_scalar_dense: what .item(), float(t),
    bool(t) and a formatted print dispatch to; on CUDA each one waits for every kernel queued
    so far) and every aten op. `seeded`: a debug read of the output in every forward
    (torch_impl.profile_meters.item_in_forward)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_impl.profile_meters import item_in_forward
    from torch_impl.train import Run, TrainConfig

    read_op = torch.ops.aten._local_scalar_dense.default

    class Census(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.where = "outside the phases"
            self.reads: dict[str, int] = {}
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            self.ops[self.where] = self.ops.get(self.where, 0) + 1
            if func is read_op:
                self.reads[self.where] = self.reads.get(self.where, 0) + 1
            return func(*args, **(kwargs or {}))

    census = Census()

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        census.where = name
        try:
            yield
        finally:
            census.where = "outside the phases"

    run = Run(TrainConfig())
    with item_in_forward(run.model) if seeded else contextlib.nullcontext([]) as calls:
        with census:
            for _ in range(SYNC_STEPS):
                run.train_step(phase=phase)
    if seeded and len(calls) != SYNC_STEPS:
        raise RuntimeError(f"the seeded read ran {len(calls)} times in {SYNC_STEPS} steps")
    phases = ("forward", "backward", "optimizer")
    return {"reads": {p: census.reads.get(p, 0) for p in phases},
            "ops": {p: census.ops.get(p, 0) for p in phases}}


def guard_no_early_read(loop: dict[str, dict[str, int]]) -> bool:
    """The regression guard: no host read of a tensor's value in the forward or the backward
    (the step's reads come after its work is queued: the optimizer phase's loss.item())."""
    return all(loop["reads"][p] == 0 for p in EARLY)


def item_in_step() -> Postmortem:
    """A debug .item() in the forward against the same loop without it."""
    seeded, repaired = sync_loop(True), sync_loop(False)
    table = [["loop", *(f"reads, {p}" for p in seeded["reads"]),
              *(f"aten ops, {p}" for p in seeded["ops"])]]
    for name, loop in (("seeded: .item() in the forward", seeded), ("repaired", repaired)):
        table.append([name, *map(str, loop["reads"].values()), *map(str, loop["ops"].values())])
    early = sum(seeded["reads"][p] for p in EARLY)
    opt = seeded["reads"]["optimizer"], repaired["reads"]["optimizer"]
    extra = seeded["ops"]["forward"] - repaired["ops"]["forward"]
    return Postmortem(
        "item_in_step", "an .item() sync inside the step",
        "a trainer's step books time in its forward that the forward's kernels do not "
        "account for: on CUDA the host stops there until the device catches up, and the "
        "profile's phases no longer say what each cost (docs/profile.md, NOTE [ Honest "
        "timing ]).",
        f"every aten op of {SYNC_STEPS} steps of the default MLP, counted by phase with a "
        "TorchDispatchMode, and among them the host reads of a value "
        "(aten._local_scalar_dense: .item(), float(t), bool(t), a formatted print), in the "
        "seeded loop and in the same loop without the debug read. On the CPU there is no "
        "queue to wait for, so the count, not the time, is the evidence; on CUDA each read "
        "is a synchronization.",
        table,
        [Hypothesis("a read before the work is queued", "a host read of a tensor's value "
                    "runs in the forward or backward, so the host waits there",
                    f"the seeded loop reads {early} values in its forward and backward over "
                    f"{SYNC_STEPS} steps ({extra} more aten ops in its forward), the "
                    "repaired loop none",
                    early > 0 and guard_no_early_read(repaired)),
         Hypothesis("the loop's own end-of-step read", "the wait is the loss.item() every "
                    "loop does after the step to log the loss",
                    f"the optimizer phase reads {opt[0]} values in the seeded loop and "
                    f"{opt[1]} in the repaired one: unchanged, so the extra reads are not "
                    "there", opt[0] != opt[1])],
        "take the debug read out of the step (return what to log and read it after the "
        "step, or keep a 0-d tensor and read it once per log interval).",
        "`postmortem_loop.guard_no_early_read`: no aten._local_scalar_dense in the forward "
        "or the backward of a step",
        guard_no_early_read(seeded), guard_no_early_read(repaired),
        {"seeded": seeded, "repaired": repaired})


# ---------------------------------------------------------------- a graph break

BREAK = "branch"  # the entry of parity.drivers.compile_breaks.CATALOGUE seeded here
COMPILE_CALLS = 3


def compile_loop(forward: Callable[..., Any], calls: int = COMPILE_CALLS) -> dict[str, Any]:
    """`forward` (model, x) -> probabilities on a small MLP: what torch._dynamo.explain
    captures of one call (graphs, breaks and their reasons), then the graphs compiled and
    the guards failed over `calls` calls with the same input (backend "eager": Dynamo's
    capture without code generation; 0: not counted, None in both), and the eager output."""
    import torch

    from parity.drivers.compile import expected_breaks_quiet
    from torch_impl import compile as tc
    from torch_impl.nn import make_mlp

    model = make_mlp((16, 32, 8), "gelu", generator=torch.Generator().manual_seed(0))
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(1))
    # resuming after a break, Dynamo probes .grad of a non-leaf: torch's own warning
    with expected_breaks_quiet(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not a leaf")
        torch._dynamo.reset()
        e = tc.explain(forward, model, x)
        r = (tc.count_recompiles(torch.compile(forward, backend="eager"), [(model, x)] * calls)
             if calls else None)
        torch._dynamo.reset()
    return {"graphs": e.graph_count, "breaks": e.graph_break_count,
            "reasons": [f"{why} ({where})" for why, where in e.break_reasons],
            "compiled": None if r is None else r.graphs,
            "failed_guards": None if r is None else len(r.failed_guards),
            "output": forward(model, x)}


def guard_one_graph(loop: dict[str, Any]) -> bool:
    """The regression guard: Dynamo captures the forward in one graph, no break."""
    return loop["graphs"] == 1 and loop["breaks"] == 0


def graph_break() -> Postmortem:
    """compile_breaks' `if tensor:` forward against its torch.where repair."""
    import torch

    from parity.drivers.compile_breaks import CATALOGUE

    entry = next(e for e in CATALOGUE if e.name == BREAK)
    seeded, repaired = compile_loop(entry.broken), compile_loop(entry.repaired, calls=0)
    same = bool(torch.equal(seeded.pop("output"), repaired.pop("output")))
    table = [["forward", "graphs (explain)", "breaks", f"graphs over {COMPILE_CALLS} calls",
              "failed guards", "break reason"]]
    for name, loop in (("seeded: `if h.mean() > 0:`", seeded),
                       ("repaired: `torch.where`", repaired)):
        table.append([name, str(loop["graphs"]), str(loop["breaks"]),
                      *("-" if loop[k] is None else str(loop[k])
                        for k in ("compiled", "failed_guards")),
                      "; ".join(loop["reasons"]) or "-"])
    return Postmortem(
        "graph_break", "a graph break under torch.compile",
        f"a compiled forward runs as {seeded['graphs']} graphs with Python between them: "
        "the compiler cannot fuse across the gap and every call returns to the interpreter "
        "in the middle.",
        f"torch._dynamo.explain of one call (graphs, breaks, each break's reason and line), "
        f"then the graphs compiled and the guards failed over {COMPILE_CALLS} calls with the "
        "same input (torch_impl.compile.count_recompiles, backend eager), for the seeded "
        "forward (parity/drivers/compile_breaks.py, entry "
        f"{BREAK}) and its repair; the repair's eager output is compared bit for bit.",
        table,
        [Hypothesis("a graph break", "Python control flow on a tensor's value ends the graph",
                    f"explain finds {seeded['graphs']} graphs and {seeded['breaks']} break "
                    f"({'; '.join(seeded['reasons']) or 'no reason'}); the repair "
                    f"{repaired['graphs']} graph, {repaired['breaks']} breaks",
                    seeded["breaks"] > 0 and repaired["breaks"] == 0),
         Hypothesis("recompilation", "a guard fails on every call, so the forward compiles "
                    "again each time",
                    f"{COMPILE_CALLS} calls compiled {seeded['compiled']} graphs, the "
                    f"{seeded['graphs']} of the first call, with {seeded['failed_guards']} "
                    "failed guards", seeded["compiled"] > seeded["graphs"]
                    or seeded["failed_guards"] > 0)],
        f"{entry.repair}; the repaired forward's output is "
        f"{'bit-identical to' if same else 'DIFFERENT from'} the seeded one's (claim "
        "compile.breaks holds every catalogue entry to it).",
        "`postmortem_loop.guard_one_graph`: explain captures the forward in one graph with "
        "no break",
        guard_one_graph(seeded), guard_one_graph(repaired) and same,
        {"seeded": seeded, "repaired": repaired, "outputs_equal": same})


# ---------------------------------------------------------------- an incomplete checkpoint

DROPPED = "scaler"  # the entry the seeded checkpoint writer leaves out
CANDIDATES = ("scaler", "rng", "data")  # what an incomplete checkpoint usually lacks
RESUME_AT, RESUME_TOTAL = 5, 8


def checkpoint_loop(drop: tuple[str, ...], directory: Path) -> dict[str, Any]:
    """Train RESUME_AT steps of parity.drivers.train.INVENTORY_CASE (fp16 with skipped steps,
    dropout, cosine lr), write a checkpoint without the entries in `drop` (the incomplete
    writer), load it, resume with what it holds to RESUME_TOTAL; beside it the uninterrupted
    run. Returns the inventory items missing from the file, per candidate entry the leaves
    that differ right after the resume from the uninterrupted state at RESUME_AT, the
    scale at that point in each, and the final digests and largest parameter difference."""
    import numpy as np

    from parity.drivers.resume import flatten
    from parity.drivers.train import INVENTORY_CASE, max_param_difference, one_thread
    from torch_impl import resume
    from torch_impl.train import INVENTORY, Run, TrainConfig, restored, state_digest

    config = TrainConfig(**INVENTORY_CASE)
    with one_thread():
        run, whole = Run(config), Run(config)
        for _ in range(RESUME_AT):
            run.train_step()
            whole.train_step()
        written = {k: v for k, v in run.state_dict().items() if k not in drop}
        path = directory / f"ckpt-{RESUME_AT:08d}.ckpt"
        resume.save_checkpoint(path, written)
        loaded = resume.load_checkpoint(path)
        missing = tuple(i for i in INVENTORY if i not in loaded)
        resumed = restored(config, loaded, omit=missing)
        at, expected = resumed.state_dict(), whole.state_dict()
        differ, leaves = {}, {}
        for item in CANDIDATES:
            a, b = flatten(at[item]), flatten(expected[item])
            differ[item] = sum(k not in a or not np.array_equal(a[k], v) for k, v in b.items())
            leaves[item] = len(b)
        scale = (float(at["scaler"]["scale"]), float(expected["scaler"]["scale"]))
        while resumed.step < RESUME_TOTAL:
            resumed.train_step()
            whole.train_step()
        final, final_whole = resumed.state_dict(), whole.state_dict()
    return {"missing": list(missing), "differ_at_resume": differ, "leaves": leaves,
            "scale_at_resume": scale,
            "digest": state_digest(final), "digest_uninterrupted": state_digest(final_whole),
            "max_param_difference": max_param_difference(final, final_whole)}


def guard_exact_resume(loop: dict[str, Any]) -> bool:
    """The regression guard: the resumed run's state digest is the uninterrupted run's."""
    return loop["digest"] == loop["digest_uninterrupted"]


def incomplete_checkpoint(drop: str = DROPPED) -> Postmortem:
    """A checkpoint written without `drop` (one of CANDIDATES) against the complete one."""
    if drop not in CANDIDATES:
        raise ValueError(f"incomplete_checkpoint: drop must be one of {CANDIDATES}, got "
                         f"{drop!r}")
    with tempfile.TemporaryDirectory(prefix="mirrortrain-postmortem-") as tmp:
        (Path(tmp) / "seeded").mkdir()
        (Path(tmp) / "repaired").mkdir()
        seeded = checkpoint_loop((drop,), Path(tmp) / "seeded")
        repaired = checkpoint_loop((), Path(tmp) / "repaired")
    table = [["checkpoint", "missing items", *(f"{c}: leaves differing at resume"
                                               for c in CANDIDATES),
              "scale at resume (resumed, uninterrupted)", f"max param difference at step "
              f"{RESUME_TOTAL}", "digests"]]
    for name, loop in ((f"seeded: written without {drop}", seeded),
                       ("repaired: complete", repaired)):
        table.append([name, ", ".join(loop["missing"]) or "none",
                      *(str(loop["differ_at_resume"][c]) for c in CANDIDATES),
                      "{:g}, {:g}".format(*loop["scale_at_resume"]),
                      f"{loop['max_param_difference']:.3g}",
                      "equal" if guard_exact_resume(loop) else "DIFFER"])
    what = {"scaler": "the loss scale S and its growth tracker",
            "rng": "the dropout generator's state", "data": "the sampler's epoch and position"}
    hypotheses = [Hypothesis(f"{c} lost", f"the checkpoint lost {what[c]}",
                             f"{seeded['differ_at_resume'][c]} of its {seeded['leaves'][c]} "
                             "leaves differ from the "
                             f"uninterrupted run's right after the resume (complete "
                             f"checkpoint: {repaired['differ_at_resume'][c]})",
                             seeded["differ_at_resume"][c] > 0) for c in CANDIDATES]
    return Postmortem(
        "incomplete_checkpoint", f"an incomplete checkpoint ({drop} dropped)",
        f"a run resumed at step {RESUME_AT} ends at step {RESUME_TOTAL} away from the "
        f"uninterrupted run: parameters differ by up to {seeded['max_param_difference']:.3g} "
        "and the state digests differ, though the checkpoint loads without error.",
        f"the run of parity.drivers.train.INVENTORY_CASE (fp16 with skipped steps, dropout "
        f"0.2, cosine lr) checkpointed at step {RESUME_AT} and resumed, beside the "
        "uninterrupted run: right after the resume, every leaf of each candidate entry "
        f"({', '.join(CANDIDATES)}) compared bit for bit with the uninterrupted state at that "
        "step (parity.drivers.resume.flatten), and the inventory items the file lacks "
        "(torch_impl.train.INVENTORY).",
        table, hypotheses,
        "write the complete state (`Run.state_dict()`: model, optimizer, scheduler, scaler, "
        "rng, data, step; docs/resume.md's inventory) and restore every item of it.",
        "`postmortem_loop.guard_exact_resume`: the resumed run's state-sha256 equals the "
        "uninterrupted run's",
        guard_exact_resume(seeded), guard_exact_resume(repaired),
        {"dropped": drop, "seeded": seeded, "repaired": repaired})
