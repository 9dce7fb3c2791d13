"""The fp8_scaling claims (the kinds and the registry: parity/tolerances.py).

The recipes (reference/fp8_scaling.py) are float32 arithmetic in a fixed order, a float64
division rounded to float32, copies and comparisons, and one cast: nothing whose rounding
may differ between the trees, so every claim is bit-exact. NaN bits are the exception where
a NaN is produced (x86 and NumPy make NaNs of different signs): those claims compare NaN as
a class. The oracles: torchao 0.18.0 (pinned) for current scaling; Transformer Engine's
delayed scaling (a CUDA library not installed here) by its kernel's formula, worked by hand.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fp8_scaling.current_trees",
        statement=(
            "Current scaling (tensorwise, and rowwise along axis 0 or -1; float8_e4m3fn and "
            "float8_e5m2; with and without power-of-2 scales) gives the same fp8 data and "
            "float32 scales in both trees, for any float32 tensor: amaxes 0, inf, NaN, "
            "subnormal and FLT_MAX included."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Each side forms f32(f64(fp8_max) / max(f64(amax), 1e-12)) (one float64 division, "
            "one rounding to float32), the float32 product x * scale (one rounding), an exact "
            "clamp and a nearest-even cast: the same correctly rounded operations in the same "
            "order; the power-of-2 rounding is exact on both sides (a bit mask in the "
            "reference, frexp/ldexp in torch). A NaN amax or inf * 0 makes a NaN whose sign "
            "and payload are the platform's, hence NaN as a class."
        ),
    ),
    Claim(
        id="fp8_scaling.torchao_current",
        extra="torchao",
        statement=(
            "torchao 0.18.0's hp_tensor_to_float8_dynamic (TENSORWISE, AXISWISE) gives the "
            "torch tree's fp8 data and scale, without power-of-2 scales for any float32 "
            "tensor, and with them wherever torchao rounds down (fp8_scaling.torchao_pow2)."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "The torch tree is torchao's own sequence of ops (tensor_to_amax: max of abs; "
            "amax_to_scale: a float64 clamp and division, then float32; _ToFloat8ConstrFunc: "
            "a float32 product; to_fp8_saturated: clamp, cast) read from its 0.18.0 source; "
            "the same ops on the same inputs give the same bits."
        ),
    ),
    Claim(
        id="fp8_scaling.torchao_pow2",
        extra="torchao",
        statement=(
            "On the 684,032 amaxes per format whose scales are the 4,096 float32 values below "
            "each power of two of every binade an amax reaches (-119..47 for e4m3, -112..54 "
            "for e5m2), torchao 0.18.0's round_scales_to_power_of_2 gives the exact round-down "
            "2^floor(log2 s) of both trees and of TE's mask, except where the correctly "
            "rounded float32 log2 of s is the next integer: there (3,873 scales for e4m3, "
            "3,726 for e5m2) it gives 2^(floor(log2 s) + 1) > s, rounded UP."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ Power-of-2 scales ]: torchao computes exp2(floor(log2(s))) in float32; for s "
            "= 2^(k+1) (1 - d), log2 s = k + 1 - d / ln 2 (to first order), and once that is "
            "within half of float32's spacing at k + 1 the log2 rounds to k + 1, which floor "
            "keeps. The expected side is the reference's round-down doubled exactly there, the "
            "place decided by float64 log2 rounded to float32 (torch's float32 log2 is not "
            "correctly rounded everywhere, yet agrees with it at every scale of the sweep); "
            "below the top 4,096 values of a binade log2 s is at least 2^-12 below k + 1, "
            "float32's spacing there at most 2^-16, so no other scale can round up."
        ),
    ),
    Claim(
        id="fp8_scaling.delayed_trees",
        statement=(
            "TE's delayed-scaling update (fused kernel order and python order, 'max' and "
            "'most_recent', margins -8..24, histories of length 1-6 over 1-4 scales), step "
            "after step with each step's amax recorded, gives the same histories and scales "
            "in both trees, for histories holding 0, inf, NaN, subnormals and FLT_MAX."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The history is moved, never computed (a roll, a zeroed slot 0, a where on "
            "last != 0), and the chosen amax is a fmax fold (NumPy's fmax.reduce, torch.fmax "
            "slot by slot: the same values, NaN skipped on both sides); the scale is one "
            "float32 product by 2^-margin (exact) and one float32 division, or the previous "
            "scale copied: every NaN copied, none produced, so bits and not only NaN classes."
        ),
    ),
    Claim(
        id="fp8_scaling.te_vectors",
        statement=(
            "Both trees give the scales and histories worked by hand from TE's kernel "
            "(delayed_scaling.cu, kernel_bulk) for its cases: a finite amax, amax 0, inf, NaN "
            "(skipped by fmaxf under 'max'), a margin, FLT_MAX for an amax so small the "
            "scale overflows, a zero slot 0 that rolls nothing, and the HYBRID formats."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The vectors are dyadic (448 = 7 * 2^6, 57344 = 7 * 2^13, amaxes powers of two or "
            "7 * 2^k), so every expected scale is exact and written as an exact constant; the "
            "rounding the kernel would do cannot hide a difference."
        ),
    ),
    Claim(
        id="fp8_scaling.margin_order",
        statement=(
            "TE's kernel order f32(f32(fp8_max 2^-m) / amax) and its docstring's (and unfused "
            "update's) (fp8_max / amax) / 2^m agree for margin 0 on every positive float32 "
            "amax; for margin m = 1, 2, 3 they differ on exactly m 2^23 - 1 amaxes, those in "
            "[fp8_max 2^-m / FLT_MAX, fp8_max / FLT_MAX), where the docstring's first quotient "
            "overflows (scale FLT_MAX) and the kernel's scale is finite; both trees give each "
            "order's bits."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ The margin's two orders ]: with 2^-m and fp8_max 2^-m exact, both are the "
            "correctly rounded fp8_max 2^-m / amax unless the docstring's quotient overflows or "
            "its product by 2^-m falls below 2^-126 (a second rounding: only for m >= 7 and "
            "amax near FLT_MAX: measured at m = 7, 8, 16 for e4m3). Swept over all 2^31 - 2^23 "
            "positive finite float32 amaxes for m = 0..3, both formats (the slow test: m = 0 "
            "and 1); the default test sweeps the two binades where the m = 1 orders part."
        ),
    ),
    Claim(
        id="fp8_scaling.inf_freeze",
        statement=(
            "An infinite amax recorded at one step keeps TE's delayed scale at its previous "
            "value for exactly amax_history_len updates under 'max' (1 under 'most_recent'), "
            "then the scale follows the finite history again; both trees give every step's "
            "scale and history bit for bit (history lengths 1-5)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The kernel takes amax = fmax over the whole history (inf wins), and an amax that "
            "is not finite keeps the previous scale; the inf enters at slot L-1 at its own "
            "update and moves down one slot per update, visible to L updates in all, and "
            "fmaxf does not skip it as it skips a NaN. Both trees run the same update "
            "(fp8_scaling.delayed_trees); the test counts the frozen updates."
        ),
    ),
    Claim(
        id="fp8_scaling.saturation",
        statement=(
            "The recipes' cast (clamp to +-max, then cast) gives the same float8_e4m3fn codes "
            "whichever overflow policy the cast has: the torch tree on the installed torch, "
            "and the reference with overflow 'saturate' (torch >= 2.13) and 'nan' (torch "
            "2.6-2.12, ml_dtypes 0.7), for products 464 (the tie above 448), 480, inf and "
            "-inf; the installed torch's raw cast is checked to be the policy its version "
            "implies."
        ),
        kind="bits",
        bound=0,
        reason=(
            "After the clamp every finite value is within +-448 and +-inf is +-448, so no "
            "value reaches the cast's overflow branch (NOTE [ float8_e4m3fn overflow ] in "
            "reference/formats.py); 464 rounds to 448 on every policy (the tie goes to the "
            "even 448). torchao's to_fp8_saturated keeps the clamp for torch <= 2.11 (its "
            "docstring says eager casts saturate from 2.12; measured, 2.12.0 and 2.12.1 still "
            "give NaN and 2.13.0 saturates)."
        ),
        library=("torch", "ml_dtypes"),
    ),
)

_CURRENT = ("fp8_scaling.current_trees",)
_DELAYED = ("fp8_scaling.delayed_trees", "fp8_scaling.te_vectors")
_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_scaling",
    modules=("reference.fp8_scaling", "torch_impl.fp8_scaling"),
    rows=(
        _same("fp8_scaling", "FLT_MAX", *_CURRENT),
        _same("fp8_scaling", "tensor_amax", *_CURRENT),
        _same("fp8_scaling", "round_down_to_power_of_2", *_CURRENT, "fp8_scaling.torchao_pow2"),
        _same("fp8_scaling", "amax_to_scale", *_CURRENT),
        _same("fp8_scaling", "cast_to_fp8", *_CURRENT, "fp8_scaling.saturation"),
        _same("fp8_scaling", "current_scaling", *_CURRENT, "fp8_scaling.torchao_current"),
        _same("fp8_scaling", "delayed_scale", *_DELAYED, "fp8_scaling.margin_order"),
        _same("fp8_scaling", "delayed_update", *_DELAYED, "fp8_scaling.inf_freeze"),
        _same("fp8_scaling", "record_amax", *_DELAYED),
    ),
    headline="parity/test_fp8_scaling.py::"
             "test_rowwise_current_scaling_casts_to_the_same_e4m3_bits_in_both_trees",
)
