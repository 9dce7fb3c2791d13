"""The optim claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Helper, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="optim.fma_bits",
        statement=(
            "reference.optim.fma and lerp equal torch's CPU add(alpha=), addcmul_ and lerp_ "
            "(scalar weight) in float32 and float64 at every size (vector body and scalar tail, "
            "0-d included), with fused = (torch's CPU capability is not DEFAULT)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "On AVX2/AVX512 builds every element is one hardware FMA (vec::fmadd in the body, "
            "GCC-contracted C++ in the tail); under ATEN_CPU_CAPABILITY=default none is. The "
            "reference computes the correctly rounded FMA exactly (float64 round-to-odd for "
            "float32, TwoProduct + TwoSum + round-to-odd for float64), a unique result."
        ),
    ),
    Claim(
        id="optim.sgd_bits",
        statement=(
            "SGD (momentum, dampening, nesterov, weight_decay, maximize) leaves parameters and "
            "momentum buffers bit-identical to torch.optim.SGD on CPU, float32 and float64, for "
            "any number of steps, with lr changed mid-run and state_dict save/load mid-run."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each step is fma(g, -lr, p), fma(p, wd, g), fma(g, 1 - dampening, b * m): scalars "
            "cast to the dtype, each op rounded once exactly as torch's kernels round "
            "(optim.fma_bits); no reduction, so no order freedom."
        ),
    ),
    Claim(
        id="optim.adam_bits",
        statement=(
            "Adam and AdamW (amsgrad, maximize, weight decay) leave parameters and every state "
            "entry bit-identical to torch.optim on CPU, float32 and float64, over steps, lr "
            "changes and save/load, when the reference is given torch's square root."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Every op but sqrt is the reference's own and rounds once like torch's kernel (lerp "
            "and addcmul fused, addcdiv unfused, Python-float bias corrections). torch's sqrt is "
            "MKL VML's, not IEEE's (optim.torch_sqrt_*), so it is the one op passed in."
        ),
    ),
    Claim(
        id="optim.adam_moments_bits",
        statement=(
            "With the reference's own IEEE sqrt and weight_decay = 0, Adam's step, exp_avg, "
            "exp_avg_sq and max_exp_avg_sq stay bit-identical to torch's for any number of steps."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The moments read only the gradients, never the parameter or the sqrt, and each "
            "moment update is bit-exact (optim.fma_bits)."
        ),
    ),
    Claim(
        id="optim.torch_sqrt_f32_ulps",
        statement=(
            "torch.sqrt of float32 CPU tensors is within 1 ulp of the correctly rounded square "
            "root (np.sqrt), and not always equal to it on MKL builds."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "MKL VML's vsSqrt (torch's CPU sqrt with MKL) is documented by Intel as accurate to < "
            "1 ulp (HA mode) but not correctly rounded: its result r and the IEEE result s are "
            "floats with |r - sqrt v| < 1 ulp and |s - sqrt v| <= 1/2 ulp, so they are equal or "
            "adjacent."
        ),
        fmt="float32",
    ),
    Claim(
        id="optim.torch_sqrt_f64_ulps",
        statement=(
            "torch.sqrt of float64 CPU tensors is within 1 ulp of the correctly rounded square "
            "root (np.sqrt)."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "As optim.torch_sqrt_f32_ulps (MKL VML vdSqrt, < 1 ulp), counted on float64's codes "
            "(parity.ulps.ulp_distance)."
        ),
        fmt="float64",
    ),
    Claim(
        id="optim.schedules_bits",
        statement=(
            "StepLR, CosineAnnealingLR and LinearLR produce bit-identical lr sequences to "
            "torch.optim.lr_scheduler for many steps and after state_dict save/load mid-run."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both evaluate the same recursive Python-float formulas (math.cos, float64) in the "
            "same order; the closed form would NOT match (NOTE [ Chainable schedules ])."
        ),
    ),
    Claim(
        id="optim.state_roundtrip_bits",
        statement=(
            "Optimizer and scheduler state converted reference -> torch -> reference (and torch "
            "-> reference -> torch) is bit-identical, and a run resumed on the other side from "
            "converted state continues bit-identically."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Conversion copies bytes (numpy <-> tensor of the same dtype) and Python scalars; "
            "nothing is recomputed or rounded."
        ),
    ),
    Claim(
        id="optim.sr_bf16_formats",
        statement=(
            "reference.optim_sr.round_bf16_stochastic(x, r) equals reference.formats.encode(x, "
            "'bfloat16', rounding='stochastic', random_bits=r << 16) bit for bit, on every "
            "float32 input (ties, subnormals, the largest finite, +-inf and NaN included)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ SR to bfloat16 is the formats' stochastic rounding ]: with u = r << 16, "
            "r < low iff u < low 2^16 = floor(2^32 low / 2^16), the 32-bit-word rule for the 16 "
            "bits bfloat16 drops; both round +-inf to itself, the largest finite up to inf, and "
            "NaN to the quiet NaN of its sign. Two computations: integer masks on the float32 "
            "bits against the encoder's decompose-round-pack."
        ),
    ),
    Claim(
        id="optim.sr_bf16_torchao",
        statement=(
            "round_bf16_stochastic equals torchao 0.18.0's _fp32_to_bf16_sr bit for bit on every "
            "non-NaN float32 input, fed the draws torchao draws (torch.manual_seed, then "
            "torch.randint(0, 2^16, shape, dtype=int32): the same values and the generator "
            "left in the same state)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The same rule (round away from zero iff r < the low 16 bits, else truncate) on the "
            "same draws: torchao's int32 arithmetic and the reference's uint32 masks give the "
            "same bits on numbers and infinities (a carry out of the largest finite is inf in "
            "both); a seeded generator replays its randint."
        ),
        extra="torchao",
    ),
    Claim(
        id="optim.sr_bf16_torchao_nan",
        statement=(
            "round_bf16_stochastic(variant='torchao') equals torchao's _fp32_to_bf16_sr on every "
            "float32 input as a NaN class: torchao turns a NaN whose payload lies in the low 16 "
            "bits into inf, and 0x7FFFFFFF / 0xFFFFFFFF into -0 / +0, when the int32 carry wraps."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "The variant is torchao's int32 arithmetic verbatim (a uint32 wrap mod 2^32 is the "
            "int32 wrap); the NaNs it leaves are then cast by torch's .bfloat16(), which writes "
            "its own NaN pattern (0xFFFF on this CPU), so NaN compares as a class."
        ),
        extra="torchao",
    ),
    Claim(
        id="optim.sr_bf16_unbiased",
        statement=(
            "Stochastic rounding to bfloat16 is unbiased: over N = 8192 uniform draws for each "
            "of 64 float32 values of every class of p (the rounded-up fraction), the mean of "
            "SR(x) equals x within sampling error."
        ),
        kind="statistical",
        bound=1e-6,
        reason=(
            "For each x, SR(x) is a (x rounded down) or a + s (up), up iff r < low, with "
            "probability p = low / 2^16 exactly for r uniform on [0, 2^16): E[SR(x)] = a + p s "
            "= x. The up-counts K_x are Binomial(N, p_x), independent; z = sum (K_x - N p_x) / "
            "sqrt(N sum p_x (1 - p_x)) is N(0, 1) to within Berry-Esseen's 0.56 rho / sigma^3 "
            "< 1e-3 at n = 524288 draws; the observation is the two-sided p-value erfc(|z| / "
            "sqrt 2), failing a correct rule with probability 1e-6 (|z| > 4.89) per seed (fixed "
            "seed: a pass stays a pass). Power: the per-draw sd is <= 1/2, so a bias of 0.01 "
            "in the probability of rounding up moves z by >= 0.01 sqrt(524288) / 0.5 = 14.5, "
            "seen with probability > 1 - 1e-15; rounding always toward zero moves it by ~700. "
            "A bias of one draw in 2^16 (r <= low) is below any sample's reach: the bits "
            "claims see it."
        ),
    ),
    Claim(
        id="optim.adamw_sr_torchao",
        statement=(
            "reference.optim_sr.AdamWSR (IEEE sqrt) leaves bf16 parameters and every state "
            "entry (step, bf16 exp_avg, exp_avg_sq, max_exp_avg_sq) bit-identical to torchao "
            "0.18.0's _AdamW(bf16_stochastic_round=True) over several steps with weight decay "
            "and amsgrad, fed torchao's draws, when inductor draws them with torch's own randint "
            "(torch._inductor.config.fallback_random = True)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "torchao's step is single_param_adam compiled by inductor: the same float32 ops in "
            "the same order (lerp, square, pow of a float32 step, sqrt, two divisions), each "
            "rounded once, inductor's sqrt IEEE's. With fallback_random it calls aten randint "
            "on the global generator, one draw per parameter per step, which the test replays. "
            "With inductor's default random (its own Philox stream seeded from the global "
            "generator) the draws are not torch.randint's and cannot be replayed: then "
            "optim.adamw_sr_torchao_moments holds what does not read them."
        ),
        extra="torchao",
    ),
    Claim(
        id="optim.adamw_sr_torchao_moments",
        statement=(
            "Under inductor's default random numbers, torchao's _AdamW(bf16_stochastic_round="
            "True) keeps step, exp_avg and exp_avg_sq bit-identical to AdamWSR's for every "
            "step, though its parameters part from AdamWSR's once the draws differ."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The moments read only the gradients and the step, never the parameter or the "
            "draws, so different draws leave them equal (the test also guards that some "
            "parameter did part, or the claim would not be about other draws)."
        ),
        extra="torchao",
    ),
    Claim(
        id="optim.sr_twins",
        statement=(
            "torch_impl.optim_sr equals reference.optim_sr bit for bit: round_bf16_stochastic "
            "on every float32 input (variant 'torchao' as a NaN class there, on NaN), and "
            "AdamWSR's parameters and state over steps, when the reference is given torch's "
            "sqrt."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The same masks on the same bits (int32 vs uint32 wraps alike), and every step op "
            "one rounding in float32 as torch's eager CPU kernels round it (lerp fused, "
            "optim.fma_bits); torch's sqrt is MKL's (optim.torch_sqrt_f32_ulps), so it is the "
            "one op passed in."
        ),
    ),
    Claim(
        id="optim.kahan_twins",
        statement=(
            "torch_impl.optim_kahan.AdamWKahan equals reference.optim_kahan.AdamWKahan bit for "
            "bit: parameters and every state entry (step, exp_avg, exp_avg_sq, compensation) "
            "over steps, bf16 parameters (0-d included) with weight decay, both variants, "
            "Kahan on and off, float32 parameters with it off, when the reference is given "
            "torch's sqrt and pow."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Every op is one torch CPU kernel computing in float32 and rounding once to the "
            "tensor it writes (bf16 nearest-even, or float32), which the reference rounds "
            "alike; add(alpha=), addcmul and lerp fused (optim.fma_bits), addcdiv not; the "
            "bf16 sqrt is IEEE's. torch's float32 sqrt (MKL) and pow (glibc powf) are not "
            "correctly rounded, so they are the ops passed in."
        ),
    ),
    Claim(
        id="optim.kahan_rule",
        statement=(
            "reference.optim_kahan.AdamWKahan (IEEE sqrt, pow32) equals each source's step "
            "written apart in the test (AnyPrecisionAdamW's and optimi's lines, each op on "
            "exact rationals rounded as its kernel rounds) bit for bit over steps with weight "
            "decay, Kahan on and off; and hand-derived test vectors."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Two computations of one rule: the reference's float32 NumPy ops and "
            "reference.fma against Fractions rounded once to float32 by parity.oracles"
            ".round_exact (then to bfloat16, as a kernel writing a bf16 tensor rounds its "
            "float32 result). Exact: +, -, *, / and fma of floats are rationals; a sqrt is "
            "float64's, rounded once more to float32, correct since 53 >= 2 * 24 + 2."
        ),
    ),
    Claim(
        id="optim.kahan_tracks_master",
        statement=(
            "Over k = 256 AdamW steps (anyprecision, no weight decay) of updates below half a "
            "bf16 spacing s, plain bf16 AdamW (kahan=False) leaves every weight unchanged, "
            "while Kahan's weight + compensation stays within (2^-9 + 2^-17 + 2^-25) k s of "
            "the fp32 master run's weight (the same AdamW on float32 parameters)."
        ),
        kind="eps",
        bound=2.0**14 + 2.0**6 + 2.0**-2,  # (2^-9 + 2^-17 + 2^-25) / eps(float32), eps = 2^-23
        scale="k s: the steps times the bf16 spacing at the weight",
        reason=(
            "With no weight decay the update u = -step_size m / d reads only the gradients, "
            "so the three runs compute the same float32 u each step. NOTE [ What the "
            "compensation holds ]: while |c + u| < s, p + c moves by exactly the bf16 rounding "
            "of f32(c + u), at most 2^-9 s + 2^-25 s (bf16's spacing below s is s 2^-8, "
            "float32's s 2^-24); the master's f32(W + u) errs by at most half float32's "
            "spacing in the binade, 2^-17 s. Summed over k steps (every weight kept in one "
            "binade, asserted). The errors are signed and partly cancel, so the observed "
            "worst case sits near 1/10 of this sum; plain's |w - W| is ~75 bounds."
        ),
    ),
)

_ROUNDTRIP = ("optim.state_roundtrip_bits",)

MANIFEST = Manifest(
    topic="optim",
    modules=("reference.fma", "reference.optim", "reference.lr_scheduler", "torch_impl.optim",
             "reference.optim_sr", "torch_impl.optim_sr", "reference.optim_kahan",
             "torch_impl.optim_kahan"),
    rows=(
        Twin("fma", reference="reference.fma:fma", alias="torch.addcmul",
             claims=("optim.fma_bits",),
             why="torch rounds a*b+c once in its CPU kernels: addcmul_, add(alpha=)"),
        Twin("lerp", reference="reference.fma:lerp", alias="torch.lerp",
             claims=("optim.fma_bits",)),
        Twin("Optimizer", reference="reference.optim:Optimizer",
             torch="torch_impl.optim:Optimizer", alias="torch.optim.Optimizer",
             claims=_ROUNDTRIP),
        Twin("SGD", reference="reference.optim:SGD", torch="torch_impl.optim:SGD",
             alias="torch.optim.SGD", claims=("optim.sgd_bits",)),
        Twin("Adam", reference="reference.optim:Adam", torch="torch_impl.optim:Adam",
             alias="torch.optim.Adam",
             claims=("optim.adam_bits", "optim.adam_moments_bits", "optim.torch_sqrt_f32_ulps",
                     "optim.torch_sqrt_f64_ulps")),
        Twin("AdamW", reference="reference.optim:AdamW", torch="torch_impl.optim:AdamW",
             alias="torch.optim.AdamW", claims=("optim.adam_bits",)),
        Twin("optimizer_state_to_torch", reference="reference.optim:Optimizer.state_dict",
             torch="torch_impl.state_mapping:optimizer_state_to_torch", claims=_ROUNDTRIP),
        Twin("optimizer_state_from_torch", reference="reference.optim:Optimizer.load_state_dict",
             torch="torch_impl.state_mapping:optimizer_state_from_torch", claims=_ROUNDTRIP),
        Twin("LRScheduler", reference="reference.lr_scheduler:LRScheduler",
             alias="torch.optim.lr_scheduler.LRScheduler",
             claims=("optim.schedules_bits", *_ROUNDTRIP)),
        Twin("StepLR", reference="reference.lr_scheduler:StepLR",
             alias="torch.optim.lr_scheduler.StepLR", claims=("optim.schedules_bits",)),
        Twin("LinearLR", reference="reference.lr_scheduler:LinearLR",
             alias="torch.optim.lr_scheduler.LinearLR", claims=("optim.schedules_bits",)),
        Twin("CosineAnnealingLR", reference="reference.lr_scheduler:CosineAnnealingLR",
             alias="torch.optim.lr_scheduler.CosineAnnealingLR",
             claims=("optim.schedules_bits",)),
        Twin("scheduler_state_to_torch", reference="reference.lr_scheduler:LRScheduler.state_dict",
             torch="torch_impl.state_mapping:scheduler_state_to_torch", claims=_ROUNDTRIP),
        Twin("scheduler_state_from_torch",
             reference="reference.lr_scheduler:LRScheduler.load_state_dict",
             torch="torch_impl.state_mapping:scheduler_state_from_torch", claims=_ROUNDTRIP),
        Twin("VARIANTS", reference="reference.optim_sr:VARIANTS",
             torch="torch_impl.optim_sr:VARIANTS", claims=("optim.sr_twins",)),
        Twin("round_bf16_stochastic", reference="reference.optim_sr:round_bf16_stochastic",
             torch="torch_impl.optim_sr:round_bf16_stochastic",
             claims=("optim.sr_twins", "optim.sr_bf16_formats", "optim.sr_bf16_torchao",
                     "optim.sr_bf16_torchao_nan", "optim.sr_bf16_unbiased")),
        Twin("AdamWSR", reference="reference.optim_sr:AdamWSR",
             torch="torch_impl.optim_sr:AdamWSR",
             claims=("optim.sr_twins", "optim.adamw_sr_torchao",
                     "optim.adamw_sr_torchao_moments")),
        Twin("VARIANTS", reference="reference.optim_kahan:VARIANTS",
             torch="torch_impl.optim_kahan:VARIANTS", claims=("optim.kahan_twins",)),
        Twin("pow32", reference="reference.optim_kahan:pow32", alias="torch.pow",
             claims=("optim.kahan_twins",),
             why="torch's float32 pow of a 0-d tensor is glibc's powf, passed in for the twins"),
        Twin("AdamWKahan", reference="reference.optim_kahan:AdamWKahan",
             torch="torch_impl.optim_kahan:AdamWKahan",
             claims=("optim.kahan_twins", "optim.kahan_rule", "optim.kahan_tracks_master")),
    ),
    helpers=(
        Helper("torch_impl.state_mapping",
               "the state mapping, not a twin: a model's, an optimizer's and a scheduler's "
               "state between the trees, by the installed torch's keys"),
    ),
    headline="parity/test_optim.py::test_adamw_steps_match_torch_adamw_bitwise",
)
