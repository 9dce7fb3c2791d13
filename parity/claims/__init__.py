"""The claim type and the topic list. Each topic declares its claims in
parity/claims/<topic>.py as `CLAIMS: tuple[Claim, ...]`; parity/tolerances.py collects them
into the one registry and explains the kinds. Beside them each topic declares its twin
manifest, `MANIFEST: Manifest`: its public names in reading order, each a `Twin` row mapping
the reference object to its torch counterpart and the claims that tie them (the format:
NOTE [ Twin manifests ] below; tests/test_manifest.py holds it to the code).
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
    "accounting", "gpt", "numerics", "profile", "compile", "ddp", "fsdp", "fp8_scaling",
    "fp8_blockwise", "mx", "nvfp4", "fp8_gemm", "fp8_train",
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
    "torch": ("2.13.0", "2.14.1"),
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


# NOTE [ Twin manifests ]
# Each topic's claims module holds `MANIFEST: Manifest` beside its `CLAIMS`: the topic's
# public names in reading order, each row a Twin that maps one name to its reference object,
# its torch counterpart, or a declared alias ("torch IS this"), and to the claims that hold
# them equal. The book renders a manifest row by row (reference | torch | claims);
# tests/test_manifest.py holds every manifest to the code, both ways. Objects are named by
# strings, never imported here: "module:qualname" ("reference.loss_scaling:GradScaler",
# "reference.optim:Adam.step") for the project's objects, a dotted path
# ("torch.amp.GradScaler") for an alias.
#
# The rules the test holds (a "twin module" is one a manifest's `modules` lists):
# 1. Every public module-level name a twin module defines (not `_`-prefixed, not imported:
#    classes, functions, constants, type aliases) is named by a row as "that.module:Name"
#    (a top-level qualname, in `reference` or `torch`); the first row naming it is its
#    ENTRY. A later row may name it again, as the counterpart of another object (torch's
#    encode_native beside the reference's encode); a dotted qualname
#    ("reference.nn:Linear.__init__"), and an object of a module the manifest does not
#    list, is a counterpart only.
# 2. A module's entries come in the manifest in that file's definition order. Where the two
#    trees define a pair in different orders, its row says so in `disorder` (one line: which
#    file puts it where) and is left out of the order check; the test fails a `disorder`
#    that no longer breaks any order.
# 3. Every string resolves (import the module, getattr along the qualname); an alias resolves
#    in torch, and where a row names both `torch` and `alias`, the two are the same object.
# 4. A row without a reference object, or without a torch object (neither `torch` nor
#    `alias`), says why in one line (`why`: "the reference's own oracle: exact rationals").
#    `name` is the last part of the reference's or the torch qualname: the row's label.
# 5. Every claim id named exists and is the manifest's topic, or is listed in `borrowed`
#    with why it is another topic's; every claim of the topic is named by some row.
# 6. Every module of reference/ and torch_impl/ (but the packages' __init__) is a twin
#    module or a helper of exactly one manifest. A helper is a module that is not half of a
#    twin (a launcher, a measurement harness, kernel tuning, a tool a user points at their
#    own trainer), listed with one line saying where it belongs.
# `headline` is the topic's headline parity test, "parity/test_<x>.py::test_name": the same
# computation once per tree, compared under a named claim; what a learner opens first after
# the twin modules.


@dataclass(frozen=True)
class Twin:
    """One row of a manifest: a public name, its two sides, and the claims that tie them."""

    name: str
    reference: str | None = None  # "reference.module:qualname" (or a common/ object)
    torch: str | None = None  # "torch_impl.module:qualname"
    alias: str | None = None  # "torch.amp.GradScaler": torch IS this
    claims: tuple[str, ...] = ()
    why: str = ""  # one line: why a side is missing (or a note on the pairing)
    disorder: str = ""  # one line: where the two trees' definition orders part

    def __post_init__(self) -> None:
        where = f"manifest row {self.name!r}"
        for field in (self.reference, self.torch):
            if field is not None and field.count(":") != 1:
                raise ValueError(f"{where}: {field!r} is not 'module:qualname'")
        if self.reference is None and self.torch is None:
            raise ValueError(f"{where}: names neither a reference nor a torch object")
        if self.alias is not None and not self.alias.startswith("torch."):
            raise ValueError(f"{where}: an alias is a torch object, not {self.alias!r}")
        if isinstance(self.claims, str):
            raise TypeError(f"{where}: claims is a tuple of ids, not one string")
        lone = self.reference is None or (self.torch is None and self.alias is None)
        if lone and not self.why.strip():
            raise ValueError(f"{where}: a name without a counterpart says why")
        if "\n" in self.why or "\n" in self.disorder:
            raise ValueError(f"{where}: why and disorder are one line each")

    @classmethod
    def same(cls, stem: str, name: str, *claims: str) -> Twin:
        """The row of a name both trees define: reference.<stem>:<name> beside
        torch_impl.<stem>:<name>."""
        return cls(name, reference=f"reference.{stem}:{name}", torch=f"torch_impl.{stem}:{name}",
                   claims=claims)

    @property
    def sides(self) -> tuple[str, ...]:
        """The row's "module:qualname" strings: its reference, then its torch object."""
        return tuple(s for s in (self.reference, self.torch) if s is not None)


@dataclass(frozen=True)
class Helper:
    """A module of reference/ or torch_impl/ that is not half of a twin, and where it goes."""

    module: str
    why: str

    def __post_init__(self) -> None:
        if not self.why.strip() or "\n" in self.why:
            raise ValueError(f"helper {self.module}: why is one line")


@dataclass(frozen=True)
class Manifest:
    """A topic's twin manifest (NOTE [ Twin manifests ]): its twin modules, its rows in
    reading order, its helpers, the claims of other topics it names, its headline test."""

    topic: str
    modules: tuple[str, ...]
    rows: tuple[Twin, ...]
    helpers: tuple[Helper, ...] = ()
    borrowed: tuple[tuple[str, str], ...] = ()  # (claim id of another topic, why)
    headline: str = ""

    def __post_init__(self) -> None:
        if self.topic not in TOPICS:
            raise ValueError(f"manifest {self.topic!r}: not one of the topics {TOPICS}")
        if not self.headline.startswith("parity/test_") or "::" not in self.headline:
            raise ValueError(f"manifest {self.topic}: headline is 'parity/test_x.py::test_y'")
