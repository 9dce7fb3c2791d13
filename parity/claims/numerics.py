"""The numerics claims: the detector's counts and findings, the same in both trees (the kinds
and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="numerics.format_view",
        statement=(
            "For any float32 array and view format (float16, bfloat16), the reference's count "
            "row (nan, +inf, -inf, zero, over_max, to_zero) computed from thresholds derived "
            "from the format's bits equals torch_impl's, computed by casting with .to(dtype) "
            "and looking at what the cast made."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counting is exact integer arithmetic; the only question is which values a "
            "round-to-nearest-even cast sends to inf or to zero. Those sets are the intervals "
            "|x| >= max + ulp(max)/2 and 0 < |x| <= smallest_subnormal/2 (both ties go to the "
            "even neighbour, inf and 0), compared in float64 where every float32 is exact; "
            "torch's cast is IEEE round to nearest even. Disagreement at one value is a bug "
            "in a threshold or in the cast, never rounding noise."
        ),
    ),
    Claim(
        id="numerics.first_invalid",
        statement=(
            "Started from the same checkpoint, with a fault of the catalogue seeded before the "
            "same step, both trees' detectors report the same first invalid value: step, "
            "phase, module path, op (torch's autograd node name), index of the first "
            "non-finite element and its value (inf, -inf, nan), and the same per-step nan/"
            "+inf/-inf counts of every activation and gradient."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Where the first non-finite value appears is decided by the fault, not by "
            "rounding: an inf weight (or one beyond float16's range, made inf by the cast) "
            "makes x * inf = +-inf in every output element whose input is non-zero, and its "
            "sign is the input's sign; the two trees' activations differ by a few ulps, which "
            "changes neither a sign nor whether a value is zero unless it lies within those "
            "ulps of 0 (the tests draw seeds; none has). The op names are looked up in the "
            "reference and read off grad_fn in torch: two independent sources."
        ),
    ),
    Claim(
        id="numerics.replay_node",
        statement=(
            "The anomaly replay of a replay file names the same backward node (torch's name, "
            "e.g. AddmmBackward0) and module in both trees, whichever tree wrote the file: "
            "torch's is the name torch.autograd.detect_anomaly(check_nan=True) raises with, "
            "the reference's comes from its own backward check (NOTE [ Backward names ])."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both check the same outputs (each backward node's input and parameter gradients) "
            "for NaN in the same order (reverse of forward). The NaN is made by inf * 0 with "
            "an inf the fault put in a weight and a zero that saturation makes exactly "
            "(1 - tanh(x)^2 = 0 once tanh rounds to 1): exact events, the same in both trees."
        ),
    ),
)
