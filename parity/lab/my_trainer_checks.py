"""Every check of the project pointed at examples/my_trainer.py, buggy and --fixed: what each
one says, as plain data. tests/test_my_trainer_example.py asserts the findings; the walk in
docs/your-trainer.md prints the committed run (docs/data/my_trainer_checks.json).

    python -m parity.lab.my_trainer_checks     rewrites docs/data/my_trainer_checks.json

The checks, each on a trainer fresh from the example's factory (seed 1337, one thread):
    scaler_guard  ScalerGuard around GUARD_STEPS steps: its findings, info ones left out
    host_reads    HostReads around GUARD_STEPS steps: the reads the loop's own code made
                  of floating-point values in every step, by line
    numerics      the numerics Detector as the step's `phase`, up to NUMERICS_STEPS steps:
                  the first invalid value, or None
    audit         `python -m parity audit` on the checkpoint the example saves after
                  GUARD_STEPS steps: its output and the rows of bug 2
    resume_check  `python -m parity resume-check` (STEPS, AT): its output
    account       StepMeter around one step: saved bytes and FLOPs (what `account --measure`
                  measures on the project's models)
File paths in the outputs are relative to the checkout, so the committed file is the same
wherever it was written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_trainer.py"
DATA = ROOT / "docs" / "data" / "my_trainer_checks.json"
GUARD_STEPS, NUMERICS_STEPS, STEPS, AT = 3, 26, 8, 4
BUG2_ROWS = ("scaler", "torch CPU RNG")


def example() -> ModuleType:
    """examples/my_trainer.py, imported as the module `my_trainer` (as resume-check, run
    from examples/, imports it)."""
    if "my_trainer" not in sys.modules:
        spec = importlib.util.spec_from_file_location("my_trainer", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["my_trainer"] = module
        spec.loader.exec_module(module)
    return sys.modules["my_trainer"]


def _relative(text: str) -> str:
    return text.replace(f"{ROOT}/", "")


def _cli(argv: list[str]) -> tuple[int, str]:
    from parity.lab.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return status, _relative(out.getvalue())


def scaler_guard(fixed: bool) -> list[str]:
    from parity.lab.your_trainer.scaler_guard import ScalerGuard

    t = example().Trainer(fixed=fixed)
    with ScalerGuard(t.scaler, t.optimizer, model=t.model) as guard:
        for _ in range(GUARD_STEPS):
            t.step()
    return [_relative(str(f)) for f in guard.report() if f.severity != "info"]


def host_reads(fixed: bool) -> dict[str, int]:
    from parity.lab.your_trainer.host_reads import HostReads

    t = example().Trainer(fixed=fixed)
    with HostReads() as reads:
        for _ in range(GUARD_STEPS):
            t.step()
    return {_relative(where): n for where, n in reads.in_user_code(GUARD_STEPS).items()}


def numerics(fixed: bool) -> dict[str, Any] | None:
    from torch_impl.numerics import Detector, NonFinite

    t = example().Trainer(fixed=fixed)
    detector = Detector(t.model, None, "float16", scaler_enabled=True)
    try:
        for step in range(NUMERICS_STEPS):
            detector.step = step
            t.step(detector.phase)
    except NonFinite as e:
        r = e.report
        return {"text": str(e), "step": r.step, "phase": r.phase, "module": r.module,
                "op": r.op, "value": r.value,
                "input_max": max(i.high for i in r.inputs if i.high is not None)}
    return None


def audit(fixed: bool) -> dict[str, Any]:
    import torch

    from parity.lab.audit_sources import audit_path

    t = example().Trainer(fixed=fixed)
    for _ in range(GUARD_STEPS):
        t.step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out-my-trainer" / "ckpt.pt"
        path.parent.mkdir()
        torch.save(t.state_dict(), path)
        status, text = _cli(["audit", str(path)])
        rows = {r.item: r.status for r in audit_path(str(path)).rows if r.item in BUG2_ROWS}
    return {"status": status, "text": text.replace(f"{tmp}/", ""), "rows": rows}


def resume_check(fixed: bool) -> dict[str, Any]:
    from parity.lab.your_trainer.resume_check import check_resume

    factory = "make_fixed_trainer" if fixed else "make_trainer"
    report = check_resume(getattr(example(), factory), steps=STEPS, at=AT,
                          fresh_process=False)
    return {"command": f"python -m parity resume-check my_trainer:{factory} --steps {STEPS} "
                       f"--at {AT}",
            "text": str(report), "ok": report.ok, "parted_at": report.parted_at,
            "parted": [d.entry for d in report.parted]}


def account(fixed: bool) -> dict[str, int]:
    import torch

    from torch_impl.accounting import StepMeter

    m = example()
    t = m.Trainer(fixed=fixed)
    with StepMeter(t.model, optimizer=t.optimizer) as meter:
        x, y = m.get_batch()
        with torch.autocast("cpu", dtype=torch.float16):
            _, loss = t.model(x, y)
        meter.backward_begins()
        t.scaler.scale(loss).backward()
    return {"saved_bytes": meter.held(), "flops": meter.flops.total}


CHECKS = {"scaler_guard": scaler_guard, "host_reads": host_reads, "numerics": numerics,
          "audit": audit, "resume_check": resume_check, "account": account}


def run_all() -> dict[str, dict[str, Any]]:
    """check -> {"buggy": result, "fixed": result}, on one thread (the same numbers on any
    machine's core count)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: {"buggy": check(False), "fixed": check(True)}
                for name, check in CHECKS.items()}
    finally:
        torch.set_num_threads(threads)


def load(path: Path = DATA) -> dict[str, Any]:
    """The committed run."""
    return json.loads(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    results = run_all()
    DATA.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {DATA.relative_to(ROOT)}")
