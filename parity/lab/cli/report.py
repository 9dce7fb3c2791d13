"""Every claim as the parity tests observe it, as one table: claim, tolerance, observed
worst case, verdict (a quick run of the tests themselves: parity/lab/report.py).

    python -m parity report [--topic T] [--out DIR] [--json] [--record]

`observed` is in the claim's own unit (a count, ulps or eps units;
docs/tolerances.md explains each) and `max |a-b|` is the raw difference behind an eps
claim's ratio. The exit status is 1 when any claim fails, errors or is asserted by no
test (the table never claims more than the tests check), when a test fails without
asserting a claim, and when no claim was checked at all; a claim whose tests pytest skipped
because an optional package it names is not installed (torchao: the oracles extra) reads
SKIPPED, with pytest's reason, and does not fail the report. --record writes what was observed
to docs/data/report.json (every claim, so not with --topic), which docs/claims/<topic>.md
prints beside each bound.
Pictures go to --out (default report/; '' for none).

--json prints, instead of the table, one JSON array with an object per claim:
{"id", "kind", "tolerance", "bound", "observed", "raw", "n", "verdict", "note", "unverified",
"seconds"}; `unverified` lists the libraries at a version the claim was never verified on
("torch 2.15.0": parity.claims.VERIFIED; the claim ran all the same);
`bound` is a number or [rtol, atol]; observed/raw are numbers, null where the check gives
none, or the strings "inf"/"nan" (JSON has no infinity). With --json pictures are drawn only
when --out is given, and every other line (pictures, the summary) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from parity.claims import TOPICS

HELP = "run the parity tests quickly and print every claim's observed worst case"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", choices=TOPICS, metavar="TOPIC",
                   help="only this topic's claims: " + ", ".join(TOPICS))
    p.add_argument("--out", default=None,
                   help="folder for pictures ('' for none; default report/, none with --json)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON array, an object per claim, instead of the table")
    p.add_argument("--record", action="store_true",
                   help="write the observations to docs/data/report.json (for docs/claims/)")


def _number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def as_json(rows: list[Any]) -> list[dict[str, Any]]:
    """The rows of report.run as plain JSON-able objects, in the table's order."""
    out = []
    for r in rows:
        c, obs = r.claim, r.observation
        out.append({
            "id": c.id, "kind": c.kind, "tolerance": c.tolerance,
            "bound": list(c.bound) if isinstance(c.bound, tuple) else c.bound,
            "observed": None if obs is None else _number(obs.observed),
            "raw": None if obs is None else _number(obs.raw),
            "n": None if obs is None else obs.n,
            "verdict": r.verdict,
            "note": r.skipped if obs is None else obs.note,
            "unverified": list(r.unverified),
            "seconds": round(r.seconds, 3),
        })
    return out


def run(args: argparse.Namespace) -> int:
    from parity.lab.cli import UsageError, output_folder, pictures_skipped, require

    require("pytest", "hypothesis", "xdist")  # the test extra: the report runs the tests
    from parity.lab import report

    if args.record and args.topic:
        raise UsageError("--record writes every claim's observation: drop --topic")
    out = args.out if args.out is not None else ("" if args.json else "report")
    # refuse a bad --out before any work
    folder = output_folder(out, command="report") if out else None
    drawn: list[Any] = []  # the pictures, drawn while the tests run (they depend on none)
    try:
        result = report.run(args.topic, meanwhile=None if folder is None else (
            lambda: drawn.extend(report.write_pictures(folder, args.topic))))
    except report.TestsDidNotRun as e:  # no table: what pytest said, and a failed report
        print(f"report: {e}", file=sys.stderr)
        return 1
    rows = result.rows
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    if args.json:
        objects = [json.dumps(o, allow_nan=False) for o in as_json(rows)]
        print("[\n" + ",\n".join(objects) + "\n]")  # valid JSON, one claim per line
    else:
        print(report.render(result))
    pictures = drawn
    if pictures:
        say("\npictures:\n" + "\n".join(f"  {p}" for p in pictures))
    elif out:
        from parity.lab.pictures import have_matplotlib

        if have_matplotlib():
            say(f"\npictures: none written (topic {args.topic} draws none)")
        else:
            pictures_skipped(args)
    skipped = [r for r in rows if r.verdict == "SKIPPED"]
    if args.record and skipped:
        say(f"\nnot recorded: {len(skipped)} claims were skipped (install the optional "
            "extras: pip install -e .[oracles])")
    elif args.record:
        from parity.lab.gendocs.claims import OBSERVED_JSON

        tests = {r.claim.id: list(r.tests) for r in rows}
        OBSERVED_JSON.write_text(json.dumps({o["id"]: {**{k: o[k] for k in (
            "observed", "raw", "n", "verdict")}, "tests": tests[o["id"]]}
            for o in as_json(rows)}, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        say(f"recorded: {OBSERVED_JSON}")
    failed = [r for r in rows if r.verdict not in ("ok", "SKIPPED")]
    if not rows:
        say(f"\nno claims checked{f' for topic {args.topic}' if args.topic else ''}: "
            "nothing holds")
        return 1
    if args.json and result.unclaimed_failures:
        say("failed tests that asserted no claim:\n" + "\n".join(result.unclaimed_failures))
    from parity import setting

    say(f"\n{setting.DESCRIPTION} (conftest.py pins it in the tests' processes)")
    unverified = sorted({u for r in rows for u in r.unverified})
    if unverified:
        say(f"{', '.join(unverified)}: not verified for this table; "
            f"{sum(1 for r in rows if r.unverified)} claims state that library's own "
            "behaviour and ran all the same (the notes above say held or not)")
    say(f"{len(rows) - len(failed) - len(skipped)}/{len(rows)} claims hold"
        + (f", {len(skipped)} skipped (an optional extra missing, or an older torch)"
           if skipped else "")
        + f" ({result.seconds:.0f} s of parity tests)")
    return 1 if failed or result.unclaimed_failures or (args.record and skipped) else 0
