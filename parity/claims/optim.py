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
            "(reference.formats.ulp_distance)."
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
)

_ROUNDTRIP = ("optim.state_roundtrip_bits",)

MANIFEST = Manifest(
    topic="optim",
    modules=("reference.fma", "reference.optim", "reference.lr_scheduler", "torch_impl.optim"),
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
    ),
    helpers=(
        Helper("torch_impl.state_mapping",
               "the state mapping, not a twin: a model's, an optimizer's and a scheduler's "
               "state between the trees, by the installed torch's keys"),
    ),
    headline="parity/test_optim.py::test_adamw_steps_match_torch_adamw_bitwise",
)
