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

# The versions of the libraries whose own behaviour some claims state (Claim.library) on
# which the whole suite and report were last run and held (.ci/torch-matrix; the README
# says which). On any other version those claims still run, never skip: the report names the
# version beside each of them, held or failed, and a failed assertion names it
# (compare.assert_claim), so a newer torch is a verdict, not a hole in the table.
VERIFIED: dict[str, tuple[str, ...]] = {
    "torch": ("2.6.0", "2.11.0", "2.13.0", "2.14.1"),
    "ml_dtypes": ("0.7.0",),
}


def installed_versions() -> dict[str, str]:
    """The installed version of each library in VERIFIED (a missing one is left out)."""
    import importlib.metadata

    found = {}
    for lib in VERIFIED:
        try:
            found[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def release(version: str) -> str:
    """A version without its local part: torch's "2.13.0+cpu" is release "2.13.0"."""
    return version.split("+", 1)[0]


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
    # the libraries whose own behaviour the claim states, not the math's (torch's finfo, its
    # cast's declared difference, ml_dtypes' NaN rule): on a version not in VERIFIED the
    # claim runs all the same and the report names that version beside it
    library: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        where = f"claim {self.id}"
        if "." not in self.id or self.topic not in TOPICS:
            raise ValueError(f"{where}: the id must start with one of the topics {TOPICS}")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind {self.kind!r} is not one of {KINDS}")
        if self.extra is not None and self.extra not in EXTRAS:
            raise ValueError(f"{where}: extra {self.extra!r} is not one of {sorted(EXTRAS)}")
        if any(lib not in VERIFIED for lib in self.library):
            raise ValueError(f"{where}: library {self.library} names one outside "
                             f"{sorted(VERIFIED)}")
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

    def unverified(self, versions: dict[str, str]) -> list[str]:
        """The libraries of `versions` (name -> installed version) that the claim states the
        behaviour of, at a version not in VERIFIED: ["torch 2.15.0"], or []."""
        return [f"{lib} {versions[lib]}" for lib in self.library
                if lib in versions and release(versions[lib]) not in VERIFIED[lib]]

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
