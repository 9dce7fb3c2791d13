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
