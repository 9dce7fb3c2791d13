"""docs/your-trainer.md: what the audit reports for each missing entry (the committed
measurement, docs/data/audit_consequences.json) and the audit command's own text."""

from __future__ import annotations

from parity.lab.gendocs import section


def _cell(value: float) -> str:
    return "**0**" if value == 0 else f"{value:.3g}"


@section("your-trainer.md", "audit-consequences")
def _() -> str:
    from parity.lab.audit_consequences import VARIANTS, load

    data = load()
    lines = [f"Case: {data['case']} (torch {data['torch']}, NumPy {data['numpy']}; "
             "`python -m parity.lab.audit_consequences` rewrites "
             "`docs/data/audit_consequences.json`).", "",
             f"| resumed without | what the resume does | max \\|Δparam\\| after "
             f"{data['total'] - data['k']} steps | data order |", "|---|---|---|---|"]
    for entry, (_, _, what) in VARIANTS.items():
        m = data["entries"][entry]
        lines.append(f"| {entry} | {what} | {_cell(m['max_dparam'])} | {m['data_order']} |")
    return "\n".join(lines)


@section("your-trainer.md", "audit-usage")
def _() -> str:
    from parity.lab.cli import audit

    return "```text\n" + (audit.__doc__ or "").strip() + "\n```"


@section("your-trainer.md", "account-any")
def _() -> str:
    from parity.lab import account_any

    report = account_any.module_report("examples.models:convnet", (4, 8), "adamw")
    return ("`python -m parity account --module examples.models:convnet --batch-shape 4,8` "
            "(AdamW):\n\n```text\n" + account_any.render_report(report) + "\n```")


@section("your-trainer.md", "resume-check-usage")
def _() -> str:
    from parity.lab.cli import resume_check

    return "```text\n" + (resume_check.__doc__ or "").strip() + "\n```"


def _block(text: str) -> str:
    return "```text\n" + text.strip() + "\n```"


@section("your-trainer.md", "my-trainer-walk")
def _() -> str:
    from parity.lab.my_trainer_checks import GUARD_STEPS, NUMERICS_STEPS, load

    run = load()
    guard, reads, numerics = run["scaler_guard"], run["host_reads"], run["numerics"]
    audit, resume, account = run["audit"], run["resume_check"], run["account"]
    rows = ", ".join(f"{item} {status}" for item, status in audit["fixed"]["rows"].items())
    lines = [
        f"**1. Clip before unscale: the scaler guard** (`ScalerGuard` around {GUARD_STEPS} "
        "steps; info findings left out):", "",
        _block("\n".join(guard["buggy"])),
        f"With `--fixed`: {len(guard['fixed'])} findings.", "",
        "**2. A checkpoint without the scaler and the RNG: the audit** (`python -m parity "
        f"audit out-my-trainer/ckpt.pt`, the file saved after {GUARD_STEPS} steps):", "",
        _block(audit["buggy"]["text"]),
        f"With `--fixed`: {rows}; exit status {audit['fixed']['status']}, unknown: "
        f"`{audit['fixed']['text'].strip().splitlines()[-1]}` (the file cannot show where "
        "the batches come from; see \"Reading them\" below).", "",
        f"**2, again: the resume check** (`cd examples && {resume['buggy']['command']}`):", "",
        _block(resume["buggy"]["text"]),
        f"With `--fixed` (`my_trainer:make_fixed_trainer`): "
        f"`{resume['fixed']['text'].splitlines()[-1]}`.", "",
        f"**3. `.item()` in every step: host reads** (`HostReads` around {GUARD_STEPS} steps, "
        "the reads the loop's own code made of floating-point values in every one of them):",
        "", _block("\n".join(f"{where}: {n} reads" for where, n in reads["buggy"].items())),
        f"With `--fixed`: {len(reads['fixed'])} such lines.", "",
        "**4. The hand-written log-softmax: the numerics detector** (`Detector` as the "
        f"step's `phase`, up to {NUMERICS_STEPS} steps):", "",
        _block(numerics["buggy"]["text"]),
        f"With `--fixed`: {'nothing' if numerics['fixed'] is None else 'a finding'} in "
        f"{NUMERICS_STEPS} steps.", "",
        f"**None of them: the accounting** (`StepMeter` around one step): saved "
        f"{account['buggy']['saved_bytes']:,} bytes and {account['buggy']['flops']:,} FLOPs "
        f"with the bugs, {account['fixed']['saved_bytes']:,} and "
        f"{account['fixed']['flops']:,} without.",
    ]
    return "\n".join(lines)
