"""Why the report reads a claim no test asserted SKIPPED rather than NOT CHECKED
(parity/lab/report.py's module docstring): its optional package missing, or an older torch
than the one that brought what it checks, and in either case a skip pytest recorded in a test
file of the claim's topic, whose reason the row shows. "" means NOT CHECKED: the report fails."""

from __future__ import annotations

from typing import Any

from parity.claims import EXTRAS, Claim


def why_skipped(c: Claim, ran: dict[str, Any], files: set[str]) -> str:
    """The SKIPPED row's reason for claim `c` in the run `ran` (files: its topic's test
    files, relative to the root), or ""."""
    return skipped_for_extra(c, ran, files) or skipped_for_torch(c, ran, files)


def _topic_skip(ran: dict[str, Any], files: set[str], naming: str | None
                ) -> dict[str, Any] | None:
    """A skip pytest recorded in one of `files` (the claim's topic's), or None: one whose
    reason names the extra `naming` if any; for a torch version (naming None), one naming no
    extra."""
    skips = [t for t in ran["tests"]
             if t["outcome"] == "skipped" and t["nodeid"].split("::")[0] in files]
    if naming is None:
        return min(skips, key=lambda t: any(e in t["message"] for e in EXTRAS), default=None)
    return min(skips, key=lambda t: naming not in t["message"], default=None)


def skipped_for_extra(c: Claim, ran: dict[str, Any], files: set[str]) -> str:
    """Why a claim no test asserted is SKIPPED (module docstring), or "" when it is not: its
    optional package missing (or not the version EXTRAS pins) in the run and a skip that
    pytest recorded in a test file of its topic."""
    if c.extra is None or c.extra not in ran.get("missing", ()):
        return ""
    first = _topic_skip(ran, files, c.extra)
    if first is None:
        return ""
    return (f"{c.extra} {EXTRAS[c.extra]} cannot be imported here (an optional extra): "
            f"pytest skipped {first['nodeid']}: {first['message']}")


def skipped_for_torch(c: Claim, ran: dict[str, Any], files: set[str]) -> str:
    """Why a claim no test asserted is SKIPPED, or "": the run's torch older than the one
    the claim's feature arrived in (Claim.torch_since) and a skip pytest recorded in a test
    file of its topic."""
    installed = ran.get("torch")
    if c.torch_since is None or installed is None:
        return ""
    version = tuple(int(part) for part in installed.split("+")[0].split(".")[:2])
    if version >= c.torch_since:
        return ""
    first = _topic_skip(ran, files, None)
    if first is None:
        return ""
    since = ".".join(map(str, c.torch_since))
    return (f"torch {installed} lacks it (from {since}, measured): pytest skipped "
            f"{first['nodeid']}: {first['message']}")
