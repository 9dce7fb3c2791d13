"""The profiles docs/profile.md shows: a default model profiled in both trees on this
machine's CPU, one after the other, with `python -m parity profile`'s own code.

    python benchmarks/profile_cpu.py [--model {mlp,gpt}] [--steps 30] [--write]

Each tree runs parity.lab.runners.profile_run.run_profile on the default ProfileCase of the
model (torch on one thread; NumPy's BLAS on one thread, set before NumPy loads) into a
temporary folder; --write keeps both profile.json objects in docs/data/profile_cpu.json
(mlp) or profile_cpu_gpt.json (gpt: train --model gpt's transformer, 16 sequences) and
redraws that model's pictures in docs/img/ (profile_*.png, profile_gpt_*.png).
`python -m parity docs` regenerates docs/profile.md's tables from those files. Without
--write it prints each tree's last line.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy loads its BLAS: one thread, as torch below

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parity.drivers import profile as drv  # noqa: E402
from parity.lab.pictures import draw_all, have_matplotlib  # noqa: E402
from parity.lab.pictures.profile import PROFILE_JSONS  # noqa: E402
from parity.lab.runners import profile_run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=drv.MODELS, default="mlp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    results = {}
    for impl in drv.IMPLS:
        case = drv.ProfileCase(impl=impl, model=args.model, steps=args.steps)
        with tempfile.TemporaryDirectory(prefix="profile-bench-") as tmp:
            result = profile_run.run_profile(case, Path(tmp), pictures=False)
        result["measured"]["trace"] = None  # the trace stays with the run, not in the docs
        results[impl] = result
        step = next(r for r in result["comparison"]["time"] if r["phase"] == "step")
        print(f"{impl}: step {step['measured']['median'] * 1e6:.0f} us (median), unexplained "
              f"{result['comparison']['unexplained']}")
    if args.write:
        record = {"machine": platform.processor() or platform.machine(),
                  "python": platform.python_version(), **results}
        path = PROFILE_JSONS[args.model]
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if have_matplotlib():
            prefix = "profile_gpt_" if args.model == "gpt" else "profile_"
            draw_all(only=lambda name: name.startswith(prefix)
                     and (args.model == "gpt" or not name.startswith("profile_gpt_")))
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
