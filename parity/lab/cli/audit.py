"""Audit a checkpoint someone else wrote: what it holds for an exact resume, what is missing,
and what resuming without each missing entry does, measured on this project's own model.

    python -m parity audit FILE [--json]

FILE, this project's own formats recognised first: a ckpt-<step>.ckpt file or its
single-process run folder (the newest file); an N-rank run folder (train --world-size N:
the newest commit whose files verify, as its resume takes), one of its step-<step>
folders, or one rank's file (rank-<r>.ckpt, __<r>_0.distcp). Then a torch.save file (a
dict; a Lightning .ckpt), a Hugging Face Trainer checkpoint-<step> folder, an Accelerate
save_state folder, or a torch.distributed.checkpoint (DCP) folder or shard file; a folder
of no known layout is named "unknown layout" with what it holds. Loading is
weights_only=True only: a file that needs pickle is refused, naming the globals it needs,
and never retried; any other pickle (Trainer's training_args.bin, a DCP .metadata) is read
by an unpickler that imports nothing, or parsed for the names it holds: nothing is run. A
.safetensors file is read from its header.
Rows: model, optimizer (per-parameter step counts), LR scheduler, GradScaler, RNG states
(torch CPU, CUDA, numpy, Python's random), data position, epoch, global step. A missing
entry's consequence is max |Δparam| after the steps to the comparison and whether the data
order repeats, committed in docs/data/audit_consequences.json
(`python -m parity.lab.audit_consequences` measures it again); CUDA, numpy and Python RNG
are needed only where the run draws from them, and the scaler only in fp16.
An N-rank checkpoint is exact when its commit record verifies and every rank's state
holds what the N-rank resume reads. A rank file alone is "impossible": the resume takes a
whole committed step, never one rank's file (it names the step to audit instead); so is a
step folder no commit record names (a save that did not finish).
Each foreign layout is read as its library resumes it (docs/your-trainer.md): Trainer's
trainer_state.json gives the batches the resume skips; a Lightning .ckpt's fit-loop
progress says whether it was saved at an epoch's end (mid-epoch: unknown, never exact);
Accelerate's pickled "step" is its accumulation counter, the global step is what the user
registered for checkpointing (custom_checkpoint_<i>.pkl) or the folder's step_<n> name. A
Lightning or Accelerate checkpoint saved at an epoch's end is exact only where it holds a
torch generator's state besides the torch CPU generator's (the DataLoader's generator=,
saved by a Callback or registered for checkpointing), else unknown: a DataLoader's own
generator, in no file, draws the next epoch's order. A DCP folder is read by its .metadata.
A save cut short (Trainer's folder without its trainer_state.json, a DCP folder without its
.metadata) is named half-written.
A .safetensors file alone is weights only; an optimizer's state_dict alone is named so.
Last line: `audit: exact resume possible`, `audit: exact resume impossible: ...` or `audit:
unknown: WHY` (nothing required is missing, but the files cannot settle it: Trainer's
training_args.bin missing, a Lightning or Accelerate checkpoint saved mid-epoch, or at an
epoch's end without its DataLoader's generator). With --json, stdout is one JSON object and
nothing else: file, kind, exact, unknown, refused, needs, rows, flags, verdict (the last
line's text), measured_on.
Exit status: 0 exact resume possible; 1 impossible (a required entry missing, incomplete or
loadable only with pickle, the whole file needs pickle, a rank or shard file alone, an
uncommitted step, a half-written save); 2 bad input (no such path, not a checkpoint,
truncated or damaged (a step's file that does not match its commit record too), a pickle
naming a global it may not hold, an unknown layout); 5 unknown.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN, UsageError

HELP = "what a checkpoint holds for an exact resume, and what each missing entry costs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE",
                   help="a torch.save / Lightning file, a .safetensors file, a Hugging Face "
                        "Trainer checkpoint-<step> folder, an Accelerate folder, a DCP "
                        "folder, or a mirrortrain checkpoint")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")


def consequence(item: str, status: str, measured: dict[str, Any]) -> dict[str, Any] | None:
    """What resuming without `item` did on the project's model (None: nothing to say)."""
    from parity.lab.audit_consequences import MEASURED_FOR, NOT_MEASURED, VARIANTS
    from parity.lab.audit_recognize import INCOMPLETE, MISSING, UNSAFE

    if status not in (MISSING, INCOMPLETE, UNSAFE):
        return None
    entry = MEASURED_FOR[item]
    if item == "scaler" and status == INCOMPLETE:
        entry = "scaler growth tracker"
    if entry is None:
        return {"entry": None, "what": NOT_MEASURED}
    m = measured["entries"][entry]
    return {"entry": entry, "what": VARIANTS[entry][2], "max_dparam": m["max_dparam"],
            "data_order": m["data_order"], "steps": measured["total"] - measured["k"]}


def _text(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    if c["entry"] is None:
        return c["what"]
    return (f"max |Δparam| {c['max_dparam']:.3g} after {c['steps']} steps, data order "
            f"{c['data_order']}: {c['what']}")


def run(args: argparse.Namespace) -> int:
    from parity.lab.audit_consequences import load
    from parity.lab.audit_recognize import AuditInputError
    from parity.lab.audit_sources import audit_path

    try:
        audit = audit_path(args.file)
    except AuditInputError as e:
        raise UsageError(str(e)) from None
    measured = load()
    rows = [{"item": r.item, "status": r.status, "where": r.where, "detail": r.detail,
             "need": r.need, "consequence": consequence(r.item, r.status, measured)}
            for r in audit.rows]
    impossible = audit.refused is not None or bool(audit.gaps())
    if audit.refused is not None:
        verdict = "exact resume impossible: " + audit.refused + (
            f" ({', '.join(audit.needs)})" if audit.needs else "")
    elif impossible:
        verdict = f"exact resume impossible: {_gaps(audit.gaps())}"
    else:
        verdict = f"unknown: {audit.unknown}" if audit.unknown else "exact resume possible"
    if args.json:
        print(json.dumps({"file": args.file, "kind": audit.kind, "exact": audit.exact,
                          "unknown": audit.unknown if not impossible else None,
                          "refused": audit.refused, "needs": list(audit.needs),
                          "rows": rows, "flags": audit.flags,
                          "verdict": verdict, "measured_on": measured["case"]}, indent=1))
    else:  # --json prints the object alone: a line after it would break json.load(stdout)
        _table(args.file, audit.kind, rows, audit.flags, measured["case"])
        print(f"audit: {verdict}")
    return EXIT_OK if audit.exact else EXIT_FAILED if impossible else EXIT_UNKNOWN


def _gaps(gaps: list[Any]) -> str:
    """'a, b missing; c incomplete; d needs pickle' of the required rows not usable."""
    from parity.lab.audit_recognize import UNSAFE

    parts = []
    for status, says in (("missing", "missing"), ("incomplete", "incomplete"),
                         (UNSAFE, "loadable only with pickle")):
        items = [r.item for r in gaps if r.status == status]
        if items:
            parts.append(f"{', '.join(items)} {says}")
    return "; ".join(parts)


def _table(file: str, kind: str, rows: list[dict[str, Any]], flags: list[str],
           case: str) -> None:
    print(f"{file}: {kind}")
    if rows:
        cells = [("item", "status", "needed", "where", "detail")] + [
            (r["item"], r["status"], r["need"], r["where"] or "-", r["detail"] or "-")
            for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(4)]
        for c in cells:
            print("  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4])
        costs = [(r["item"], _text(r["consequence"])) for r in rows if r["consequence"]]
        if costs:
            print(f"\nwithout it, measured on {case}:")
            for item, text in costs:
                print(f"  {item}: {text}")
    if flags:
        print("\nflags:")
        for flag in flags:
            print(f"  - {flag}")
