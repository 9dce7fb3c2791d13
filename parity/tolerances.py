"""The claim table: every parity assertion in this project names one of these claims.

A claim is `Claim(id=..., statement=..., kind=..., bound=..., reason=...)` (parity/claims/
__init__.py); its topic is the id's first part. Each topic declares its claims in
`parity/claims/<topic>.py`; this module collects them, in the order of `TOPICS`, into the one
registry that tests, report checks and docs look claims up in.

kind         bound means                                   compared by (parity/compare.py)
-----------  --------------------------------------------  -------------------------------------
bits         mismatching bit patterns allowed (always 0)    integer views of the two arrays
nan_class    mismatches allowed (always 0); NaN == NaN      integer views, NaNs as one class
ulps         k: |a - b| <= k units in the last place of     exact integer distance on the
             the format named in `fmt`; both sides must     format's ordered encoding, after
             already be members of that format              checking membership
eps          c: |a - b| <= c * eps * S elementwise; eps     float64 arithmetic on |a - b| /
             of the compared dtype, S an array the claim    (eps * S); the caller passes S
             describes in `scale` (|y|, (k+1)|A||B|, ...)

Tolerances are declared once, each with the derivation in `reason`; a test looks its claim up
by id and never writes a bare number. `docs/tolerances.md` and `docs/claims/<topic>.md` are
generated from this table (`python -m parity docs`).
"""

from __future__ import annotations

import importlib

from parity.claims import KINDS, TOPICS, Claim, Kind

__all__ = ["CLAIMS", "KINDS", "TOPICS", "Claim", "Kind", "claim", "topic_claims"]


def _collect() -> tuple[Claim, ...]:
    found: list[Claim] = []
    for topic in TOPICS:
        module = importlib.import_module(f"parity.claims.{topic}")
        for c in module.CLAIMS:
            if c.topic != topic:
                raise RuntimeError(f"claim {c.id} is declared in parity/claims/{topic}.py")
        found.extend(module.CLAIMS)
    return tuple(found)


CLAIMS: tuple[Claim, ...] = _collect()

_BY_ID = {c.id: c for c in CLAIMS}
if len(_BY_ID) != len(CLAIMS):
    raise RuntimeError("duplicate claim ids in parity/claims/")


def claim(claim_id: str) -> Claim:
    """The claim with this id (KeyError names the known ids of the same topic)."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        topic = claim_id.split(".", 1)[0]
        known = sorted(c.id for c in CLAIMS if c.topic == topic) or sorted(_BY_ID)
        raise KeyError(f"unknown claim {claim_id!r}; known: {', '.join(known)}") from None


def topic_claims(topic: str) -> tuple[Claim, ...]:
    """The claims of one topic; ValueError listing the topics for an unknown one."""
    if topic not in TOPICS:
        raise ValueError(f"unknown topic {topic!r}; the topics are {', '.join(TOPICS)}")
    return tuple(c for c in CLAIMS if c.topic == topic)
