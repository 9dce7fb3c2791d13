"""`python -m parity report`, cold: a fresh process, an empty Inductor cache, pictures drawn
into a temporary folder; prints the wall clock and the CPU time of the report and every
process it waited for (user + sys of the children, as /usr/bin/time counts them), the
machine's load before and after, and the slowest claims (the table's seconds column).

    python benchmarks/report_cold.py [--topic T] [--top N] [--header] [--save FILE]

Cold means an empty TORCHINDUCTOR_CACHE_DIR. Inductor keeps one more thing outside it: the
precompiled C++ header of its CPU kernels (about 150 MB, some 10 s of CPU to build), in
$TMPDIR/torchinductor_$USER/precompiled_headers, reused by every later process on the
machine; --header points TMPDIR at a fresh directory too, so that the run builds it as a
fresh machine's first run would.

The target: at most 60 s wall on an idle 2-core machine, about 110 s of CPU in all. On a
shared machine the wall clock measures the neighbours too: quote the CPU time beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic", default=None, help="only this topic's claims")
    p.add_argument("--top", type=int, default=12, help="how many of the slowest claims")
    p.add_argument("--header", action="store_true",
                   help="build Inductor's precompiled header afresh too (a fresh TMPDIR)")
    p.add_argument("--save", type=Path, default=None,
                   help="write the report's rows (--json) to FILE, to compare two runs' tables")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-cold-") as tmp:
        cache, pictures = Path(tmp) / "inductor", Path(tmp) / "pictures"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        if args.header:
            (Path(tmp) / "tmp").mkdir()
            env["TMPDIR"] = str(Path(tmp) / "tmp")
        command = [sys.executable, "-m", "parity", "report", "--json", "--out", str(pictures)]
        if args.topic:
            command += ["--topic", args.topic]
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(f"exit {done.returncode}  wall {wall:.1f} s  user {user:.1f} s  sys {system:.1f} s  "
          f"cpu {user + system:.1f} s  load {load:.2f} -> {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} cores)")
    try:
        rows = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
        return 1
    if args.save is not None:
        args.save.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    bad = [r["id"] for r in rows if r["verdict"] != "ok"]
    print(f"{len(rows)} claims, {len(rows) - len(bad)} ok" + (f"; not ok: {bad}" if bad else ""))
    for r in sorted(rows, key=lambda r: -r["seconds"])[:args.top]:
        print(f"  {r['seconds']:7.1f} s  {r['id']}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
