"""The course's mini-project end to end on the compact model: "profiled, resumable training
with one repaired fault", its deliverables written to DIR, then self-graded.

    python -m parity miniproject --out DIR [--device cpu|cuda] [--repeats R]
                                 [--fault NAME | --all-faults]

Writes DIR/profile/ (the prediction sheet, committed before anything is measured, and the
synchronized profile), DIR/postmortem.md and .json (the fault NAME, by default
fp16_without_scaler: hypotheses, the discriminating measurement, a hypothesis rejected by a
measured number, the repair, a guard that fails on the seeded loop and passes on the
repaired one; with --all-faults one DIR/postmortems/NAME.md and .json per fault, each graded
in its own rubric row), DIR/optimize-autocast-bf16.md (the optimization gauntlet), DIR/resume.md (a
training process SIGKILLed while committing a checkpoint; the previous checkpoint survives;
the resumed run's digest equals the uninterrupted one) and DIR/rubric.md. The rubric, one row
per criterion with its evidence and Pass or Strong and why, is printed last; a piece whose
command this checkout lacks is "missing", never faked.
Exit status: 0 every row at least Pass; 1 a row missing or failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from parity.lab.cli import EXIT_FAILED, EXIT_OK, int_at_least, output_folder, pictures_skipped
from parity.lab.runners import miniproject as mp
from parity.lab.runners import postmortem as pmr
from parity.lab.runners import postmortem_record as record
from parity.lab.runners import profile_grades as grades

HELP = "the mini-project end to end: profile, postmortem, optimization, resume; self-graded"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="where the deliverables go")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the profile's device (default cpu)")
    p.add_argument("--repeats", type=int_at_least(3), default=15, metavar="R",
                   help="timed repeats per side of the optimization report (default 15)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--fault", choices=tuple(pmr.FAULTS), default=pmr.DEFAULT,
                       metavar="NAME", help="the fault the postmortem investigates: "
                       f"{', '.join(pmr.FAULTS)} (default {pmr.DEFAULT})")
    which.add_argument("--all-faults", action="store_true",
                       help="a postmortem of every fault, each graded in the rubric")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from parity.lab.cli import optimize as opt_cli
    from parity.lab.runners import optimize as opt

    out = output_folder(args.out, command=args.command)
    rows: list[mp.Row] = []
    bar = tqdm(total=4, desc="miniproject", unit="piece", leave=False)

    bar.set_postfix_str("profile")
    rows += _profile_rows(out / "profile", args.device)
    bar.update(1)

    bar.set_postfix_str("postmortem")
    rows += write_postmortems(out, list(pmr.FAULTS) if args.all_faults else [args.fault])
    bar.update(1)

    bar.set_postfix_str("optimization gauntlet")
    g = opt.run_gauntlet(opt.parse("autocast-bf16"), args.repeats, 10)
    stem = "optimize-autocast-bf16"
    (out / f"{stem}.json").write_text(json.dumps(opt_cli.as_json(g), indent=1) + "\n")
    picture = opt_cli.draw(g, out / f"{stem}.png")
    if picture is None:  # (the profile's are skipped too: profile/profile-output.txt says so)
        pictures_skipped(args)
    (out / f"{stem}.md").write_text(opt_cli.markdown(g, picture))
    rows += mp.optimization_rows(g, stem, opt_cli.verdict(g))
    bar.update(1)

    bar.set_postfix_str("kill and resume")
    with tempfile.TemporaryDirectory(prefix="mirrortrain-miniproject-") as tmp:
        ev = mp.resume_evidence(Path(tmp))
    (out / "resume.md").write_text(resume_markdown(ev))
    rows.append(mp.resume_row(ev))
    bar.update(1)
    bar.close()

    text = rubric_markdown(rows)
    (out / "rubric.md").write_text(text)
    print(text, end="")
    ok = all(grade in ("Pass", "Strong") for _, grade, _, _ in rows)
    print(f"miniproject: {sum(g in ('Pass', 'Strong') for _, g, _, _ in rows)}/{len(rows)} "
          f"rows pass; deliverables in {out}")
    return EXIT_OK if ok else EXIT_FAILED


def _profile_rows(folder: Path, device: str) -> list[mp.Row]:
    """The prediction sheet and the synchronized profile, from `python -m parity profile`."""
    if importlib.util.find_spec("parity.lab.cli.profile") is None:
        why = "this checkout has no `python -m parity profile`"
        return [("prediction before measurement", "missing", "-", why),
                ("honest timing (profile)", "missing", "-", why)]
    done = subprocess.run([sys.executable, "-m", "parity", "profile", "--impl", "torch",
                           "--device", device, "--out", str(folder)], capture_output=True,
                          text=True, timeout=900)
    (folder / "profile-output.txt").parent.mkdir(parents=True, exist_ok=True)
    (folder / "profile-output.txt").write_text(done.stdout + done.stderr)
    return grades.profile_rows(folder, done.returncode)


def write_postmortems(out: Path, names: list[str]) -> list[mp.Row]:
    """Investigate each fault of `names`; write its markdown and JSON (one fault:
    out/postmortem.md, .json; several: out/postmortems/NAME.md, .json) and return its rubric
    row, which names the fault and the file."""
    rows = []
    for name in names:
        pm = pmr.investigate(name)
        stem = "postmortem" if len(names) == 1 else f"postmortems/{name}"
        (out / stem).parent.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(record.markdown(pm))
        (out / f"{stem}.json").write_text(record.as_json(pm))
        rows.append(record.fault_repair_row(pm, f"{stem}.md"))
    return rows


def resume_markdown(ev: mp.ResumeEvidence) -> str:
    command = " ".join(("python -m parity train --impl torch --steps", str(mp.RESUME_STEPS),
                        *mp.RESUME_OPTIONS))
    return f"""# Interrupted and resumed

`{command}` was SIGKILLed while committing the checkpoint of step {mp.KILL_AT}: its
temporary file was written and fsynced, the rename not yet done
(parity/lab/runners/miniproject.py `paused_train` stops the process at that instant, so the
kill lands there every time).

- checkpoints before the kill: {', '.join(ev.before_kill) or 'none'}
- left by the kill: {', '.join(ev.leftover_temp) or 'no temporary file'}
- checkpoints after the kill, each loaded and verified: {', '.join(ev.survivors)}
- `--resume`: {ev.resumed_from}
- state digest, resumed:       `{ev.digest_resumed}`
- state digest, uninterrupted: `{ev.digest_uninterrupted}`
- {'equal: the kill cost nothing but the steps since the last checkpoint' if ev.exact
   else 'DIFFERENT'}
"""


def rubric_markdown(rows: list[mp.Row]) -> str:
    lines = ["# Mini-project: self-graded", "",
             "| criterion | grade | evidence | why |", "|---|---|---|---|"]
    lines += [f"| {c} | {g} | {e} | {r} |" for c, g, e, r in rows]
    return "\n".join(lines) + "\n"
