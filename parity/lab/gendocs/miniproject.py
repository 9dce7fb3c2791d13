"""docs/miniproject.md: the table of faults (from the registry) and the committed run's
self-grading."""

from __future__ import annotations

from parity.lab.gendocs import DOCS, section

RUN = DOCS / "data" / "miniproject"
DELIVERABLES = ("profile/predictions.md", "profile/profile.md", "postmortem.md",
                "optimize-autocast-bf16.md", "resume.md", "rubric.md")
# --all-faults writes postmortems/NAME.md in place of postmortem.md (listed after it)


@section("miniproject.md", "rubric")
def _() -> str:
    rubric = RUN / "rubric.md"
    if not rubric.exists():
        return ("No committed run yet (`python -m parity miniproject --out "
                "docs/data/miniproject`).\n")
    table = rubric.read_text().split("\n", 2)[2]  # drop the title line and the blank after
    files = [name for name in DELIVERABLES if (RUN / name).exists()]
    every = sorted(p.relative_to(RUN).as_posix() for p in (RUN / "postmortems").glob("*.md"))
    if every:
        files[files.index("optimize-autocast-bf16.md"):0] = every
    return table.replace("](", "](data/miniproject/") + "\nDeliverables: " + ", ".join(
        f"[{name}](data/miniproject/{name})" for name in files) + ".\n"


@section("miniproject.md", "faults")
def _faults() -> str:
    from parity.lab.runners.postmortem import FAULTS

    lines = ["| fault (`--fault`) | symptom | discriminating measurement | rejected hypothesis "
             "| repair | guard |", "|---|---|---|---|---|---|"]
    lines += [f"| `{f.name}` | {f.symptom} | {f.measurement} | {f.rejected} | {f.repair} | "
              f"{f.guard} |" for f in FAULTS.values()]
    return "\n".join(lines) + "\n"
