"""`python -m parity`: every claim checked, range tables, sweeps, fuzzing, training.

    report                  every claim's quick check, as a table; pictures into --out
    ranges                  the range table of every format, reference / torch / ml_dtypes
    sweep FORMAT            reference vs torch vs ml_dtypes over float32 inputs
    fuzz                    the parity property tests, for a time budget
    tolerances              the claim table as Markdown
    docs                    regenerate every generated part of docs/ and its pictures
    train                   the compact model trained and checkpointed (parity/train_cli.py)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path


def cmd_report(args: argparse.Namespace) -> int:
    from parity import report

    rows = report.run(args.topic)
    print(report.render(rows))
    pictures = report.write_pictures(Path(args.out)) if args.out else []
    if pictures:
        print(f"\npictures: {', '.join(str(p) for p in pictures)}")
    elif args.out:
        print("\npictures: none written (install the 'plot' extra for matplotlib)")
    failed = [r for r in rows if r.verdict != "ok"]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} claims hold")
    return 1 if failed else 0


def cmd_ranges(args: argparse.Namespace) -> int:
    from parity.ranges import range_table

    text, differences = range_table()
    print(text)
    return 1 if differences else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from parity import sweep

    start = time.perf_counter()
    if args.exhaustive:
        summary = sweep.sweep_range(args.format, 0, 2**32, workers=args.workers, progress=True)
    else:
        summary = sweep.sweep_sample(args.format, args.sample, seed=args.seed,
                                     workers=args.workers, progress=True)
    print(sweep.render(summary, time.perf_counter() - start))
    return 1 if summary.mismatches_torch or summary.mismatches_ml_dtypes else 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    from parity.fuzz import fuzz

    return fuzz(seconds=args.seconds, topic=args.topic, device=args.device)


def cmd_tolerances(args: argparse.Namespace) -> int:
    from parity.gendocs.claims import tolerances_markdown

    print(tolerances_markdown())
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from parity import gendocs, pictures
    from parity.report import load_checks

    changed = gendocs.update()
    for path in changed:
        print(f"wrote {path}")
    print(f"{len(gendocs.PARTS)} generated parts, {len(changed)} pages changed")
    load_checks()  # topics that still register pictures beside their checks
    drawn = pictures.draw_all()
    if drawn:
        print(f"drew {len(drawn)} pictures into {pictures.IMG}")
    else:
        print("pictures: none drawn (install the 'plot' extra for matplotlib)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("report", help="check every claim quickly and print the table")
    p.add_argument("--topic", help="only this topic's claims (e.g. formats)")
    p.add_argument("--out", default="report", help="folder for pictures ('' for none)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("ranges", help="range table of every format, side by side")
    p.set_defaults(func=cmd_ranges)

    p = sub.add_parser("sweep", help="reference vs torch vs ml_dtypes over float32 inputs")
    p.add_argument("format", help="float16, bfloat16, float8_e5m2 or float8_e4m3fn")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--exhaustive", action="store_true", help="all 2^32 float32 inputs")
    mode.add_argument("--sample", type=int, default=1 << 24, help="random inputs (default 2^24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("fuzz", help="run the hypothesis parity tests for a time budget")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--topic", help="only parity/test_TOPIC.py")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.set_defaults(func=cmd_fuzz)

    p = sub.add_parser("tolerances", help="the claim table as Markdown")
    p.set_defaults(func=cmd_tolerances)

    p = sub.add_parser("docs", help="regenerate the generated parts of docs/")
    p.set_defaults(func=cmd_docs)

    if importlib.util.find_spec("parity.train_cli") is not None:  # lands with resume/train
        from parity import train_cli

        train_cli.add_parser(sub)
        sub.choices["train"].set_defaults(func=train_cli.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
