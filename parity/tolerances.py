"""The claim table: every parity assertion in this project names one of these claims.

A claim is `Claim(id, topic, statement, kind, bound, reason)`:

kind         bound means                                   compared by (parity/compare.py)
-----------  --------------------------------------------  -------------------------------------
bits         mismatching bit patterns allowed (always 0)    integer views of the two arrays
nan_class    mismatches allowed (always 0); NaN == NaN      integer views, NaNs as one class
ulps         k: |a - b| <= k units in the last place of     exact integer distance on the
             the format named in `fmt`                      format's ordered encoding
close        (rtol, atol): |a - b| <= atol + rtol * |b|     float64 arithmetic
statistical  false-failure probability of the test          the test's own statistic

Tolerances are declared here once, each with the derivation in `reason`; a test or a report
check looks its claim up by id and never writes a bare number. `docs/tolerances.md` is
generated from this table (`python -m parity tolerances --write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["bits", "nan_class", "ulps", "close", "statistical"]
KINDS: tuple[str, ...] = ("bits", "nan_class", "ulps", "close", "statistical")


@dataclass(frozen=True)
class Claim:
    """One checked statement: what must hold, how tightly, and why that tightness."""

    id: str
    topic: str
    statement: str
    kind: Kind
    bound: float | tuple[float, float]
    reason: str
    fmt: str | None = None  # the format whose ulp an `ulps` bound counts in

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if not self.reason.strip():
            raise ValueError(f"claim {self.id}: a claim without a reason is a bug")
        if self.kind in ("bits", "nan_class") and self.bound != 0:
            raise ValueError(f"claim {self.id}: {self.kind} claims allow 0 mismatches")
        if self.kind == "ulps" and self.fmt is None:
            raise ValueError(f"claim {self.id}: an ulps claim must name its format")
        if self.kind == "close" and not (isinstance(self.bound, tuple) and len(self.bound) == 2):
            raise ValueError(f"claim {self.id}: a close claim's bound is (rtol, atol)")
        if self.kind == "statistical" and not 0 < float(self.bound) < 1:  # type: ignore[arg-type]
            raise ValueError(f"claim {self.id}: a statistical bound is a probability in (0, 1)")

    @property
    def tolerance(self) -> str:
        """The bound in words, as the report and docs/tolerances.md print it."""
        if self.kind == "bits":
            return "bit-identical"
        if self.kind == "nan_class":
            return "bit-identical, NaN as a class"
        if self.kind == "ulps":
            return f"<= {self.bound:g} ulp of {self.fmt}"
        if self.kind == "close":
            rtol, atol = self.bound  # type: ignore[misc]
            return f"rtol={rtol:.3g}, atol={atol:.3g}"
        return f"P(false failure) <= {self.bound:.1e}"


# One tuple per topic, concatenated below; a topic edits only its own tuple.
FORMATS_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "formats.ranges",
        "formats",
        "Every range property of every named format (bits, eps, max, tiny, smallest subnormal, "
        "max/min exponent) is equal in reference.formats, torch.finfo and ml_dtypes.finfo.",
        "bits",
        0,
        "The properties are exact dyadic numbers derived from (exponent bits, mantissa bits, "
        "convention); any difference would be an error, not rounding.",
    ),
    Claim(
        "formats.decode",
        "formats",
        "Every bit pattern of every 8- and 16-bit format decodes to the same value in the "
        "reference, in torch (.view then .to(float32)) and in ml_dtypes.",
        "nan_class",
        0,
        "Decoding is exact (every format value is a float32); NaN payloads are not "
        "preserved alike by the three libraries, so NaNs compare as a class.",
    ),
    Claim(
        "formats.encode_f32",
        "formats",
        "Encoding float32 inputs with round-to-nearest-even is bit-identical to torch's native "
        "cast (with torch's overflow policy) and to ml_dtypes (with overflow='nan' for "
        "float8_e4m3fn); every NaN input gives a NaN.",
        "nan_class",
        0,
        "One correctly rounded operation has one right answer; NaN sign and payload differ "
        "between libraries and even between torch code paths (bf16 NaN is 0xFFFF from "
        "Tensor.to on CPU, 0x7FC0 elsewhere), so NaNs compare as a class.",
    ),
    Claim(
        "formats.encode_f64_correct",
        "formats",
        "Encoding float64 inputs (via=None) is correctly rounded: equal to rounding the exact "
        "rational value with fractions.Fraction, and equal to the torch twin's round-to-odd "
        "construction.",
        "nan_class",
        0,
        "Correct rounding is unique. The torch twin gets it from native casts by rounding to "
        "odd in float32 first (float32 keeps >= 2 more bits than every target; Boldo and "
        "Melquiond 2008), an independent construction.",
    ),
    Claim(
        "formats.encode_f64_via_f32",
        "formats",
        "Encoding float64 inputs with via='float32' is bit-identical to torch's native "
        "float64 -> low-precision cast, which rounds through float32 (double rounding).",
        "nan_class",
        0,
        "Both round twice at the same two precisions; each rounding is exact RNE.",
    ),
    Claim(
        "formats.toward_zero",
        "formats",
        "Rounding toward zero is bit-identical between the reference (truncation of the "
        "integer significand) and the torch twin (native cast, then one step toward zero "
        "where the cast rounded away).",
        "nan_class",
        0,
        "Truncation has one right answer; NaNs compare as a class.",
    ),
    Claim(
        "formats.stochastic_bits",
        "formats",
        "Given the same 32-bit random words, stochastic rounding of float32 inputs is "
        "bit-identical in the reference and the torch twin.",
        "nan_class",
        0,
        "Both round up exactly when the random word is below the top 32 dropped bits; "
        "integer comparisons have no rounding.",
    ),
    Claim(
        "formats.stochastic_unbiased",
        "formats",
        "Stochastic rounding is unbiased: the mean of n roundings of x lies within "
        "z * sigma / sqrt(n) of x, sigma = sqrt(p(1-p)) * spacing, z = 5.0.",
        "statistical",
        5.8e-7,
        "Each rounding is lo + spacing * Bernoulli(p); by the CLT the standardized mean is "
        "~N(0,1) for n = 20000, and P(|Z| > 5) = 5.7e-7 (two-sided) per checked input.",
    ),
    Claim(
        "formats.sweep",
        "formats",
        "Over all 2^32 float32 inputs (slow) or a sample, the reference, torch and ml_dtypes "
        "encodings agree except where the declared overflow/NaN policies differ.",
        "nan_class",
        0,
        "Exhaustive form of formats.encode_f32.",
    ),
)

NN_CLAIMS: tuple[Claim, ...] = ()

OPTIM_CLAIMS: tuple[Claim, ...] = ()

DATA_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "data.task",
        "data",
        "make_task(seed, n, ...) gives bit-identical inputs, labels and values in the "
        "reference (NumPy) and the torch twin, computed independently, float32 and float64.",
        "bits",
        0,
        "Words are integer hashes mod 2^32 (exact on both sides: uint64 products in NumPy, "
        "split 32x16-bit int64 products in torch); inputs are k * 2^-23, exact; the teacher "
        "uses small integer weights, so every partial sum is a multiple of 2^-23 below 2^18: "
        "exact in float64 in any BLAS order (NOTE [ Exact teacher arithmetic ]); float32 is "
        "then one correctly rounded cast; argmax takes the first maximum in both.",
    ),
    Claim(
        "data.order",
        "data",
        "epoch_order(seed, epoch, n) is the same permutation in the reference and in torch, "
        "for every seed and epoch in [0, 2^32).",
        "bits",
        0,
        "The order is the argsort of hashed words (integer ops, exact on both sides); the "
        "hash is a bijection of the index, so the words are distinct and the sorted order "
        "is unique: numpy.argsort and torch.argsort cannot disagree.",
    ),
    Claim(
        "data.resume_reference",
        "data",
        "In the reference, saving ResumableSampler.state_dict() after any number of batches "
        "(mid-epoch, at an epoch boundary, with or without drop_last) and loading it into a "
        "fresh sampler yields the same remaining batches as the uninterrupted run.",
        "bits",
        0,
        "The order of an epoch is a pure function of (seed, epoch) and the state counts "
        "exactly the indices consumed; index streams are integers, compared exactly.",
    ),
    Claim(
        "data.resume_torch",
        "data",
        "In torch, a DataLoader from make_loader over a ResumableSampler restored from "
        "state_dict() after any number of batches yields the same remaining batches "
        "(inputs, labels, values, batch sizes) as the uninterrupted DataLoader.",
        "bits",
        0,
        "Single-process DataLoader pulls exactly one batch of indices per next(), so the "
        "sampler state is what was consumed; batches are copies of dataset rows, no arithmetic.",
    ),
    Claim(
        "data.loader",
        "data",
        "The batch stream of make_loader is bit-identical across implementations, and a "
        "sampler state saved by one implementation resumes the same stream in the other.",
        "bits",
        0,
        "Same dataset bits (data.task), same order (data.order), the same batching rule "
        "(reference BatchSampler mirrors torch.utils.data.BatchSampler) and one state "
        "format of plain ints; batching copies rows without arithmetic.",
    ),
)

CLAIMS: tuple[Claim, ...] = FORMATS_CLAIMS + NN_CLAIMS + OPTIM_CLAIMS + DATA_CLAIMS

_BY_ID = {c.id: c for c in CLAIMS}
if len(_BY_ID) != len(CLAIMS):
    raise RuntimeError("duplicate claim ids in parity/tolerances.py")


def claim(claim_id: str) -> Claim:
    """The claim with this id (KeyError names the known ids of the same topic)."""
    try:
        return _BY_ID[claim_id]
    except KeyError:
        topic = claim_id.split(".", 1)[0]
        known = sorted(c.id for c in CLAIMS if c.topic == topic) or sorted(_BY_ID)
        raise KeyError(f"unknown claim {claim_id!r}; known: {', '.join(known)}") from None
