"""The claim type and the topic list. Each topic declares its claims in
parity/claims/<topic>.py as `CLAIMS: tuple[Claim, ...]`; parity/tolerances.py collects them
into the one registry and explains the kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Five kinds, each used by claims. `statistical`: the bound is a false-failure probability
# alpha, the observation the smallest (multiple-test adjusted) p-value of the test's
# statistics, and the claim holds when observed >= alpha; its reason states the test's power
# against the error it must see (the init of two generators that cannot draw alike). A
# relative/absolute `close` kind was dropped when no claim used it: every other tolerance here
# is an eps bound with its scale S derived. A claim that needs it brings it back, with its
# comparison in parity/compare.py.
Kind = Literal["bits", "nan_class", "ulps", "eps", "statistical"]
KINDS: tuple[str, ...] = ("bits", "nan_class", "ulps", "eps", "statistical")

# The topics, in the order the report and docs/tolerances.md list them.
TOPICS: tuple[str, ...] = (
    "formats", "nn", "optim", "data", "amp", "loss_scaling", "recompute", "resume", "train",
    "accounting", "gpt", "numerics", "profile", "compile", "ddp", "fsdp", "fp8_scaling", "mx",
    "fp8_gemm", "fp8_train",
)


# the optional packages claims may name (Claim.extra), each with the one version whose
# source the claims were read against: another version counts as missing, as its tests skip
EXTRAS = {"torchao": "0.18.0"}


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One checked statement: what must hold, how tightly, and why that tightness.

    The topic is the id's first part (`formats.decode` belongs to formats).
    """

    id: str
    statement: str
    kind: Kind
    bound: float
    reason: str
    fmt: str | None = None  # ulps: the format whose ulp the bound counts in
    scale: str | None = None  # eps: what S is, in words ("|y_torch|", "(k+1) |A||B|")
    # the optional package (pyproject's extras: "oracles") without which every test of the
    # claim skips: the report shows the claim SKIPPED, not NOT CHECKED, when that package
    # was missing in its run AND pytest skipped a test of the claim's topic (report.py)
    extra: str | None = None
    # the first torch (major, minor) that has what the claim checks, measured (EXTRAS and
    # this are the only reasons a claim may go unasserted): on an older torch its tests skip
    # and the report shows it SKIPPED, when pytest skipped a test of its topic (report.py)
    torch_since: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        where = f"claim {self.id}"
        if "." not in self.id or self.topic not in TOPICS:
            raise ValueError(f"{where}: the id must start with one of the topics {TOPICS}")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind {self.kind!r} is not one of {KINDS}")
        if self.extra is not None and self.extra not in EXTRAS:
            raise ValueError(f"{where}: extra {self.extra!r} is not one of {sorted(EXTRAS)}")
        if not self.reason.strip():
            raise ValueError(f"{where}: a claim without a reason is a bug")
        if self.kind in ("bits", "nan_class") and self.bound != 0:
            raise ValueError(f"{where}: {self.kind} claims allow 0 mismatches")
        if self.kind == "ulps" and self.fmt is None:
            raise ValueError(f"{where}: an ulps claim must name its format")
        if self.kind == "statistical" and not 0 < self.bound < 1:
            raise ValueError(f"{where}: a statistical claim's bound is a false-failure "
                             "probability in (0, 1)")
        if (self.kind == "eps") != (self.scale is not None):
            raise ValueError(f"{where}: an eps claim, and only an eps claim, names its scale S")

    @property
    def topic(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def tolerance(self) -> str:
        """The bound in words, as the report and docs/tolerances.md print it."""
        if self.kind == "bits":
            return "bit-identical"
        if self.kind == "nan_class":
            return "bit-identical, NaN as a class"
        if self.kind == "ulps":
            return f"<= {self.bound:g} ulp of {self.fmt}"
        if self.kind == "statistical":
            return f"p >= {self.bound:g} (false-failure probability)"
        return f"|a-b| <= {self.bound:g} eps · {self.scale}"
