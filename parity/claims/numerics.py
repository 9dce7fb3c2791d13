"""The numerics claims: the detector's counts and findings, the same in both trees (the kinds
and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Helper, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="numerics.format_view",
        statement=(
            "For any float32 array and view format (float16, bfloat16, float8_e5m2, "
            "float8_e4m3fn, float8_e4m3fnuz, float8_e5m2fnuz), the reference's count "
            "row (nan, +inf, -inf, zero, over_max, to_zero) computed from thresholds derived "
            "from the format's bits equals torch_impl's, computed by casting with .to(dtype) "
            "and looking at what the cast made (past the range: inf, NaN, or saturated)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counting is exact integer arithmetic; the only question is which values a "
            "round-to-nearest-even cast sends past the range or to zero. Those sets are the "
            "intervals |x| >= max + ulp(max)/2 and 0 < |x| <= smallest_subnormal/2 (both ties "
            "go to the even neighbour: past the range where max's significand is odd, to max "
            "in float8_e4m3fn, whose max 1.110b x 2^8 is even, and to 0), compared in float64 "
            "where every float32 is exact; torch's cast is IEEE round to nearest even, and a "
            "saturating one (float8_e4m3fn from torch 2.13) is read through the cast of half "
            "the value. Disagreement at one value is a bug in a threshold or in the cast, "
            "never rounding noise."
        ),
    ),
    Claim(
        id="numerics.first_invalid",
        statement=(
            "Started from the same checkpoint, with a fault of the catalogue seeded before the "
            "same step (the MLP's or the transformer's), both trees' detectors report the same "
            "first invalid value: step, phase, the module that made it (torch's module path; "
            "for a container such as the attention core, the op inside it found by a watched "
            "re-run), op (torch's autograd node name), index of the first non-finite element "
            "and its value (inf, -inf, nan), and the same per-step nan/+inf/-inf counts of "
            "every activation and gradient."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Where the first non-finite value appears is decided by the fault, not by "
            "rounding: an inf weight (or one beyond float16's range, made inf by the cast) "
            "makes x * inf = +-inf in every output element whose input is non-zero, and its "
            "sign is the input's sign; the two trees' activations differ by a few ulps, which "
            "changes neither a sign nor whether a value is zero unless it lies within those "
            "ulps of 0 (the tests draw seeds; none has). The transformer's faults are exact "
            "events too: a zero-variance row gives 0 * inf = NaN in any rounding; a NaN table "
            "entry is gathered as is; a score q k^T of 2^24 times its fp32 size lies far "
            "beyond 65520, where the rounding to inf cannot depend on an ulp (a score within "
            "ulps of 65520 could: the seeds drawn have none); the GELU's x^3 at -1e30 "
            "overflows in float32 in both. The faults that are code are exact events as well: the "
            "hand-written loss's softmax is exactly 0 where the target's logit trails by more "
            "than 103.3 (float32; the catalogue's logits trail by hundreds, far from that edge) "
            "and log(0) = -inf; the diverging learning rate's weights grow by a factor 1e8 per "
            "update, elementwise and bit-identical in float32 training, so the update where "
            "they pass float32's max, and hence the step (derived by running, stated in the "
            "catalogue as its delay), is the same in both; an inline add of two finite 2e38 "
            "is 4e38 in any rounding, beyond 3.4e38. The op names are looked up in the "
            "reference (its op functions and the ufuncs of a container's own body by name) "
            "and read off grad_fn or the aten op in torch: two independent sources."
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
            "(1 - tanh(x)^2 = 0 once tanh rounds to 1; the tanh-GELU's derivative at -1e30), "
            "or it is already in the forward and log_softmax's backward returns it first, or the "
            "hand-written loss's 1/p at p = 0 is -inf and softmax's backward p (g - sum p g) "
            "makes 0 * inf = NaN (SoftmaxBackward0, the reference's loss records each of its "
            "torch nodes' outputs; the replay file names the loss, which is code, not state): "
            "exact events, the same in both trees. The replay restores the state, not code: "
            "a module attribute (LayerNorm's eps) is not in it, and both trees find nothing."
        ),
    ),
    Claim(
        id="numerics.underflow_counts",
        statement=(
            "With the catalogue's fp16_without_scaler seeded (no GradScaler, the output "
            "layer's weights times 2^-16), both trees' detectors count the same exact zeros "
            "in every parameter's gradient at the fault's step, and no non-finite value; with "
            "the GradScaler kept (the repair, S = 2^16) every gradient's zero count is 0 in "
            "both trees."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A count is an integer: it can differ only where one gradient element is zero in "
            "one tree and not in the other, i.e. where its exact value lies within the two "
            "trees' float16 backward difference (amp.model_fp16: 0 ulps for most elements, k "
            "where a rounding boundary falls within the float32 error bound) of the cast's "
            "tie 2^-25 or of the edge of a product that flushes to zero. The tanh MLP has no "
            "exact zeros of its own, so every zero is an underflow. Scaled by 2^16, the "
            "same gradients lie 2^16 above those edges, far inside float16's range: none "
            "rounds to zero."
        ),
    ),
)

_FIRST = ("numerics.first_invalid",)
_COUNTS = ("numerics.format_view", "numerics.first_invalid", "numerics.underflow_counts")
_REPLAY = ("numerics.replay_node",)
_ONE_PASS = ("the layout of torch's one-pass count (NOTE [ One pass of counting ]): the "
             "reference counts each column directly")
_ANY = "the detector on any trainer's own step, for the lab: the reference runs train_step"
_same = Twin.same

MANIFEST = Manifest(
    topic="numerics",
    modules=("reference.numerics", "torch_impl.numerics", "torch_impl.numerics_counts",
             "reference.numerics_locate", "torch_impl.numerics_locate", "reference.faults",
             "torch_impl.faults"),
    rows=(
        Twin("OP_NAMES", reference="reference.numerics:OP_NAMES", claims=_FIRST,
             why="torch's node name per reference node: torch reads it off the graph"),
        Twin("VIEWS", torch="torch_impl.numerics:VIEWS", claims=_FIRST,
             why="the view nodes torch's op_name looks through: the reference makes none"),
        _same("numerics", "op_name", *_FIRST),
        _same("numerics", "view_format", "numerics.format_view"),
        Twin("STRIDE", torch="torch_impl.numerics_counts:STRIDE", why=_ONE_PASS),
        Twin("ARITHMETIC_FROM", torch="torch_impl.numerics_counts:ARITHMETIC_FROM",
             why=_ONE_PASS),
        Twin("past_range", reference="common.numerics_report:thresholds",
             torch="torch_impl.numerics_counts:past_range", claims=("numerics.format_view",)),
        Twin("thresholds_bits", reference="common.numerics_report:thresholds",
             torch="torch_impl.numerics_counts:thresholds_bits",
             claims=("numerics.format_view",)),
        Twin("bucket_counts", reference="reference.numerics:count_rows",
             torch="torch_impl.numerics_counts:bucket_counts", claims=_COUNTS),
        Twin("gathered", torch="torch_impl.numerics_counts:gathered", why=_ONE_PASS),
        Twin("rows", torch="torch_impl.numerics_counts:rows", why=_ONE_PASS),
        Twin("count_rows", reference="reference.numerics:count_rows",
             torch="torch_impl.numerics_counts:count_rows", claims=_COUNTS),
        _same("numerics", "first_nonfinite", *_FIRST),
        _same("numerics", "input_range", *_FIRST),
        _same("numerics", "input_ranges", *_FIRST),
        _same("numerics", "leaf_paths", *_FIRST),
        _same("numerics", "all_paths", *_FIRST),
        _same("numerics", "Detector", *_COUNTS),
        Twin("GradHook", reference="reference.numerics:GradHook",
             alias="torch.Tensor.register_hook",
             why="a micro-step's gradient before it is added to .grad (NOTE [ Counting the "
                 "increment ]): the reference's Parameter has no hooks of its own"),
        _same("numerics", "model_name", *_FIRST),
        Twin("backward_name", reference="reference.numerics:backward_name",
             alias="torch.autograd.detect_anomaly", claims=_REPLAY),
        _same("numerics", "anomaly_replay", *_REPLAY),
        Twin("checked_step", torch="torch_impl.numerics:checked_step", why=_ANY),
        Twin("replay_step", torch="torch_impl.numerics:replay_step", why=_ANY),
        Twin("OPS", reference="reference.numerics_locate:OPS", claims=_FIRST,
             why="the reference's ops by torch's node names: torch's dispatch names them "
                 "(node_name)"),
        Twin("Autocast", reference="reference.amp:AutocastState",
             torch="torch_impl.numerics_locate:Autocast", claims=_FIRST),
        Twin("Call", torch="torch_impl.numerics_locate:Call",
             why="a call's keyword arguments (a user's model takes them): reference modules "
                 "take positional ones"),
        Twin("autocast_state", reference="reference.amp:autocast_state",
             torch="torch_impl.numerics_locate:autocast_state", claims=_FIRST),
        _same("numerics_locate", "finite", *_FIRST),
        Twin("is_float", reference="reference.numerics_locate:is_float",
             alias="torch.is_floating_point", claims=_FIRST),
        _same("numerics_locate", "ended_maker", *_FIRST),
        _same("numerics_locate", "maker", *_FIRST),
        Twin("UFUNCS", reference="reference.numerics_locate:UFUNCS", claims=_FIRST,
             why="the NumPy ufuncs a re-run watches, by torch's node names: torch's dispatch "
                 "names its own ops (node_name)"),
        Twin("node_name", reference="reference.numerics_locate:OPS",
             torch="torch_impl.numerics_locate:node_name", claims=_FIRST),
        _same("numerics_locate", "watch_ops", *_FIRST),
        _same("faults", "apply_fault", "numerics.first_invalid", "numerics.underflow_counts"),
        Twin("log", reference="reference.faults:log", alias="torch.log", claims=_FIRST),
        _same("faults", "HandWrittenCrossEntropy", *_FIRST),
        _same("faults", "LOSSES", *_FIRST),
        _same("faults", "loss_of", *_REPLAY),
    ),
    helpers=(
        Helper("torch_impl.numerics_extremes",
               "kernel tuning: torch's count of large tensors, row for row the bucket pass "
               "(NOTE [ Counting by the magnitude's extremes ]); stays beside numerics.py, "
               "which runs it"),
    ),
    headline="parity/test_numerics.py::"
             "test_an_fp16_weight_overflow_is_named_alike_by_both_trees_detectors",
)
