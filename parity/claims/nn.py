"""The nn claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Helper, Manifest, Twin

# nn: most bounds are `eps` claims, |a - b| <= c eps S elementwise, with eps the compared
# dtype's machine epsilon (2^-23 for float32, 2^-52 for float64), u = eps/2 the unit
# roundoff, and S the scale named in `scale` (computed by parity/drivers/nn.py).
# Claims stated "on CPU" rest on torch's CPU kernels (SLEEF's 1-ulp functions, ATen's CPU
# operation order, the unfused dropout); CUDA's libdevice functions (2-ulp tanhf, erff),
# nvcc's FMA contraction and fused dropout are outside their derivations, so their tests
# skip under --device cuda. The others are claimed on any device.
CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="nn.relu",
        statement="ReLU forward and input gradient are bit-identical to torch (float32, float64).",
        kind="bits",
        bound=0,
        reason="max(x, 0) and where(y > 0, g, 0) are exact: no rounding anywhere.",
    ),
    Claim(
        id="nn.tanh.forward",
        statement="Tanh forward on CPU: |y_ref - y_torch| <= 2 eps |y_torch|.",
        kind="eps",
        bound=2.0,
        scale="|y_torch|",
        reason=(
            "NumPy's tanh and torch's SLEEF tanh (u10) are each within 1 ulp of tanh(x), and 1 "
            "ulp(y) <= eps |y|, so they differ by <= 2 eps |y|."
        ),
    ),
    Claim(
        id="nn.tanh.backward",
        statement="Tanh input gradient g (1 - y^2) on CPU: |dx_ref - dx_torch| <= 6 eps |g|.",
        kind="eps",
        bound=6.0,
        scale="|g|",
        reason=(
            "y differs by <= 2 eps|y| (nn.tanh.forward), so y^2 by <= 4 eps y^2 + 2u y^2; 1 - y^2 "
            "and the product by g each round once per side (2u|1-y^2| + 2u|dx|); with |y| <= 1 "
            "the total is <= (4 + 1 + 1 + 0.5) eps |g| < 6 eps |g|."
        ),
    ),
    Claim(
        id="nn.gelu_tanh.forward",
        statement="GELU(approximate='tanh') forward on CPU: |y_ref - y_torch| <= 3 eps |x|.",
        kind="eps",
        bound=3.0,
        scale="|x|",
        reason=(
            "Both evaluate NOTE [ GELU formulas ] with the same dtype constants and operation "
            "order, so tanh's argument is bit-identical; t = tanh(.) differs by <= 2 eps, 1 + t "
            "rounds (u per side), y = 0.5 x (1 + t) rounds (u|y| <= u|x| per side): |dy| <= "
            "0.5|x|(2 eps + eps) + eps|x| = 2.5 eps |x|."
        ),
    ),
    Claim(
        id="nn.gelu_tanh.backward",
        statement=(
            "GELU(approximate='tanh') input gradient on CPU: |dx_ref - dx_torch| <= 8 eps S, "
            "S = |g| (1 + |x| (1 + x^2))."
        ),
        kind="eps",
        bound=8.0,
        scale="|g| (1 + |x| (1 + x^2))",
        reason=(
            "Same formula and order both sides (NOTE [ GELU formulas ]); only t differs (<= 2 "
            "eps). 0.5 (1 + t) carries <= 1.5 eps; (1 - t^2) carries <= 5 eps absolute and is "
            "multiplied by 0.5 |x| beta (1 + 3 kappa x^2) <= 0.4 |x| (1 + x^2); the 6 remaining "
            "roundings add <= 6 u of the largest term. Sum < 8 eps S."
        ),
    ),
    Claim(
        id="nn.gelu.forward",
        statement="Exact (erf) GELU forward on CPU: |y_ref - y_torch| <= 5 eps |x|.",
        kind="eps",
        bound=5.0,
        scale="|x|",
        reason=(
            "float64: erf (math.erf vs SLEEF u10) differs by <= 2 ulp, as for tanh GELU -> 2.5 "
            "eps|x|. float32: torch's GELU kernel uses ATen's vectorized float erf (a polynomial "
            "with exp, not SLEEF); measured on a dense grid of 2e6 points on [-12, 12] against "
            "float64 erf, torch is within 3.13 eps|x| of exact GELU and the reference (float64 "
            "erf rounded once) within 0.9 eps|x|: 4.03 -> bound 5."
        ),
    ),
    Claim(
        id="nn.gelu.backward",
        statement=(
            "Exact (erf) GELU input gradient on CPU: |dx_ref - dx_torch| <= 4 eps S, S = |g| (1 + "
            "|x| (1 + x^2))."
        ),
        kind="eps",
        bound=4.0,
        scale="|g| (1 + |x| (1 + x^2))",
        reason=(
            "cdf + x pdf with pdf = alpha exp(-x^2/2): erf and exp differ by <= 2 ulp (float64), "
            "exp's argument carries eps x^2/2 relative -> x pdf error <= eps |x|^3 pdf; float32 "
            "adds torch's vectorized erf: measured on 4e5 grid points in [-12, 12] torch is "
            "within 1.9 eps S of the exact derivative, the reference within 0.5: 2.4 -> bound 4."
        ),
    ),
    Claim(
        id="nn.dropout",
        statement=(
            "Given the same keep-mask, Dropout's output and input gradient are bit-identical to "
            "torch's nn.Dropout (training, CPU kernel), and both are the identity in eval and "
            "for p = 0 (any device)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ Dropout mask ]: both compute x * (keep / (1 - p)) in the input dtype with the "
            "same two roundings (the division, the product); the gradient is g * mask."
        ),
    ),
    Claim(
        id="nn.linear",
        statement=(
            "Linear forward, input, weight and bias gradients: |a - b| <= eps (k + 1) S with S = "
            "|A| |B| (+ |b|) the product of absolute values and k its inner length (in_features, "
            "out_features, batch N, batch N)."
        ),
        kind="eps",
        bound=1.0,
        scale="(k + 1)(|A| |B| + |b|)",
        reason=(
            "A dot product of length k in any summation order (and with or without FMA) is within "
            "gamma_k sum|a_i b_i| ~ k u S of the exact value (Higham, Thm 3.5); NumPy's OpenBLAS "
            "and torch's MKL/addmm use different orders, so they differ by <= 2 (k + 1) u S = (k "
            "+ 1) eps S (k + 1: the bias add)."
        ),
    ),
    Claim(
        id="nn.mse_loss.elementwise",
        statement=(
            "MSELoss with reduction='none', and its input gradient for every reduction, are "
            "bit-identical to torch."
        ),
        kind="bits",
        bound=0,
        reason=(
            "(x - t)^2 and (x - t) * norm * g are the same IEEE operations in the same order "
            "(torch's mse_loss_backward: sub, mul_(2/n rounded to dtype), mul_(grad))."
        ),
    ),
    Claim(
        id="nn.mse_loss.reduced",
        statement=(
            "MSELoss 'sum' and 'mean': |l_ref - l_torch| <= eps (n + 1) S, S = sum (x - t)^2 "
            "(divided by n for 'mean')."
        ),
        kind="eps",
        bound=1.0,
        scale="(n + 1) sum (x - t)^2 [/ n]",
        reason=(
            "The n squared terms are bit-identical (nn.mse_loss.elementwise); only the summation "
            "order differs (NumPy pairwise, torch cascaded): each side within gamma_n S of the "
            "exact sum, plus one rounding of the division by n."
        ),
    ),
    Claim(
        id="nn.cross_entropy",
        statement=(
            "CrossEntropyLoss loss and input gradient: |a - b| <= eps S. With A = C + 5 + 5 ln C "
            "for C classes: per row A + |nll| ('none'); sum_i (A + |nll_i|) + (N - 1) sum_i "
            "|nll_i| ('sum'); that divided by N, plus |loss| ('mean'); for the gradient, "
            "elementwise |g'| p (A + 6 + |log p|) + |dx| + (5 |g'| + 2) eta / eps, g' the "
            "incoming gradient (/ N for 'mean'), p the softmax, eta the smallest subnormal."
        ),
        kind="eps",
        bound=1.0,
        scale="A + |nll| per row, A = C + 5 + 5 ln C; reduced and gradient forms in the statement",
        reason=(
            "NOTE [ Cross-entropy error budget ]. x - max x and the final (x - max x) - log Z are "
            "the same IEEE operations in the same order on both sides (torch's log_softmax kernel "
            "keeps that order). Per side, exp is within a_e eps relative, the C-term sum adds (C "
            "- 1) u in any order, log Z (0 <= log Z <= ln C) adds a_l eps ln C and the "
            "subtraction u |log p|; SLEEF (torch) has a_e = a_l = 1, NumPy's float32 SIMD exp and "
            "log are not correctly rounded and are taken as a_e = a_l = 4 (float64: 1). Both sides "
            "together: |d log p| <= eps (C + 4 + 5 ln C + |log p|) < eps (A + |log p|). A "
            "reduction over N rows adds (N - 1) eps sum |nll| (two summations in any order) and "
            "'mean' one rounding of the division per side. The gradient g' (p - onehot) is formed "
            "as g' onehot-part plus exp(log p) g' (torch's log_softmax backward, possibly fused): "
            "p carries eps (A + |log p| + 5) relative, the product and the sum round once each "
            "per side (eps/2 p |g'| and eps/2 |dx| each); where p or the product is subnormal "
            "these errors are absolute, up to a_e eta |g'| for exp and eta/2 per rounding."
        ),
    ),
    Claim(
        id="nn.saved_tensors",
        statement=(
            "For every layer the reference's tape holds tensors of the same shapes, dtypes and "
            "bytes as what torch's saved_tensors_hooks see (parameters excluded on both sides)."
        ),
        kind="bits",
        bound=0,
        reason="Shapes, dtypes and byte counts are integers: any difference is a design mismatch.",
    ),
    Claim(
        id="nn.state_dict_roundtrip",
        statement=(
            "reference state_dict -> torch -> reference (and torch -> reference -> torch) keeps "
            "every key, shape, dtype and bit; the converted model gives torch's outputs."
        ),
        kind="bits",
        bound=0,
        reason="The conversion is a copy: no arithmetic.",
    ),
    Claim(
        id="nn.mlp.forward",
        statement=(
            "make_mlp output with the same weights (and dropout masks) is within the bound "
            "propagated layer by layer: e_out = |W| e_in + eps (k + 1)(|W||x| + |b|) for Linear, "
            "e_out = L e_in + (the layer's claim) for activations (L = 1, 1, 1.13 for ReLU, Tanh, "
            "GELU)."
        ),
        kind="eps",
        bound=1.0,
        scale="the first-order bound propagated layer by layer, in eps",
        reason=(
            "First-order forward error analysis: each layer adds its own claimed bound and passes "
            "the incoming difference on amplified by at most |W| (Linear) or its Lipschitz "
            "constant (max GELU' = 1.1290 < 1.13)."
        ),
    ),
)

_SAVED, _STATE = ("nn.saved_tensors",), ("nn.state_dict_roundtrip",)
_NO_CHECK = "a guard of the reference's own: torch's kernels raise their own errors"

MANIFEST = Manifest(
    topic="nn",
    modules=("reference.module", "torch_impl.module", "reference.nn", "torch_impl.nn",
             "reference.losses"),
    rows=(
        Twin("FLOAT_DTYPES", reference="reference.module:FLOAT_DTYPES",
             why="the dtypes a reference layer computes in: torch's take any dtype"),
        Twin("INPUT_DTYPES", reference="reference.module:INPUT_DTYPES",
             why="what a reference layer accepts (autocast's 2-byte arrays too): torch's any"),
        Twin("Parameter", reference="reference.module:Parameter",
             torch="torch_impl.module:Parameter", alias="torch.nn.Parameter", claims=_STATE),
        Twin("SavedTensor", reference="reference.module:SavedTensor",
             torch="torch_impl.saved_tensors:SavedTensor", claims=_SAVED),
        Twin("RemovableHandle", reference="reference.module:RemovableHandle",
             torch="torch_impl.module:RemovableHandle", alias="torch.utils.hooks.RemovableHandle"),
        Twin("register_module_forward_pre_hook",
             reference="reference.module:register_module_forward_pre_hook",
             torch="torch_impl.module:register_module_forward_pre_hook",
             alias="torch.nn.modules.module.register_module_forward_pre_hook"),
        Twin("register_module_forward_hook",
             reference="reference.module:register_module_forward_hook",
             torch="torch_impl.module:register_module_forward_hook",
             alias="torch.nn.modules.module.register_module_forward_hook"),
        Twin("register_module_full_backward_hook",
             reference="reference.module:register_module_full_backward_hook",
             torch="torch_impl.module:register_module_full_backward_hook",
             alias="torch.nn.modules.module.register_module_full_backward_hook"),
        Twin("hooked_call", reference="reference.module:hooked_call",
             torch="torch_impl.module:hooked_call", alias="torch.nn.Module.__call__"),
        Twin("Node", reference="reference.module:Node", torch="torch_impl.module:Node",
             alias="torch.autograd.graph.Node", claims=_SAVED),
        Twin("saved_tensor_names", reference="reference.module:Node.saved_tensors",
             torch="torch_impl.saved_tensors:saved_tensor_names", claims=_SAVED),
        Twin("saved_during", reference="reference.module:Node.tape",
             torch="torch_impl.saved_tensors:saved_during", claims=_SAVED),
        Twin("Module", reference="reference.module:Module", torch="torch_impl.module:Module",
             alias="torch.nn.Module", claims=_STATE),
        Twin("measure_saved_tensors", reference="reference.module:Module.tape",
             torch="torch_impl.saved_tensors:measure_saved_tensors", claims=_SAVED),
        Twin("state_dict_to_torch", reference="reference.module:Module.state_dict",
             torch="torch_impl.state_mapping:state_dict_to_torch", claims=_STATE),
        Twin("state_dict_from_torch", reference="reference.module:Module.load_state_dict",
             torch="torch_impl.state_mapping:state_dict_from_torch", claims=_STATE),
        Twin("check_float", reference="reference.module:check_float", why=_NO_CHECK),
        Twin("check_grad", reference="reference.module:check_grad", why=_NO_CHECK),
        Twin("matmul", reference="reference.nn:matmul", torch="torch_impl.nn:matmul",
             alias="torch.matmul", claims=("nn.linear",)),
        Twin("Linear", reference="reference.nn:Linear", torch="torch_impl.nn:Linear",
             alias="torch.nn.Linear", claims=("nn.linear",)),
        Twin("init_linear_", reference="reference.nn:Linear.__init__",
             torch="torch_impl.nn:init_linear_",
             why="nn.Linear's init from a given generator: the reference's Linear draws "
                 "the same distribution from its rng, not the same numbers"),
        Twin("ReLU", reference="reference.nn:ReLU", torch="torch_impl.nn:ReLU",
             alias="torch.nn.ReLU", claims=("nn.relu",)),
        Twin("Tanh", reference="reference.nn:Tanh", torch="torch_impl.nn:Tanh",
             alias="torch.nn.Tanh",
             claims=("nn.tanh.forward", "nn.tanh.backward")),
        Twin("GELU", reference="reference.nn:GELU", torch="torch_impl.nn:GELU",
             alias="torch.nn.GELU",
             claims=("nn.gelu.forward", "nn.gelu.backward", "nn.gelu_tanh.forward",
                     "nn.gelu_tanh.backward")),
        Twin("Dropout", reference="reference.nn:Dropout", torch="torch_impl.nn:Dropout",
             alias="torch.nn.Dropout", claims=("nn.dropout",)),
        Twin("Sequential", reference="reference.nn:Sequential", torch="torch_impl.nn:Sequential",
             alias="torch.nn.Sequential", claims=("nn.mlp.forward",)),
        Twin("ACTIVATIONS", reference="reference.nn:ACTIVATIONS",
             torch="torch_impl.nn:ACTIVATIONS"),
        Twin("make_mlp", reference="reference.nn:make_mlp", torch="torch_impl.nn:make_mlp",
             claims=("nn.mlp.forward",)),
        Twin("REDUCTIONS", reference="reference.losses:REDUCTIONS",
             why="the reduction strings every loss takes: torch checks them in each loss"),
        Twin("Loss", reference="reference.losses:Loss", alias="torch.nn.modules.loss._Loss"),
        Twin("MSELoss", reference="reference.losses:MSELoss", alias="torch.nn.MSELoss",
             claims=("nn.mse_loss.elementwise", "nn.mse_loss.reduced")),
        Twin("CrossEntropyLoss", reference="reference.losses:CrossEntropyLoss",
             alias="torch.nn.CrossEntropyLoss", claims=("nn.cross_entropy",)),
    ),
    helpers=(
        Helper("torch_impl.saved_tensors",
               "the measurement of autograd's tape, not a twin: what each node saved, named "
               "and attributed to the innermost module"),
    ),
    headline="parity/test_nn.py::"
             "test_linear_forward_and_backward_match_torch_linear_within_dot_product_bound",
)
