"""reference.amp against its own oracles: outside autocast the layers are the plain model bit
for bit; inside it outputs, saved tensors and incoming gradients are real 2-byte arrays
made by reference.formats' rounding (checked against ml_dtypes' and NumPy's own casts),
master weights are untouched, an autocast Linear is the exact product of its lp operands
rounded once (float64 oracle), the backward rounds an incoming float32 gradient first,
contexts nest like torch.autocast's, and the policy follows the lists and type promotion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import numpy_dtype
from parity.strategies import examples
from parity.ulps import ulp_distance
from reference import amp, recompute
from reference import nn as rnn
from reference.formats import quantize

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _model(activation: str = "tanh", dropout: float = 0.0) -> rnn.Sequential:
    return rnn.make_mlp((6, 16, 3), activation, dropout, rng=np.random.default_rng(0))


@pytest.mark.parametrize("context", [lambda: amp.autocast(None),
                                     lambda: amp.autocast("float16", enabled=False)])
def test_disabled_autocast_is_the_plain_model_bit_for_bit(context: object) -> None:
    """autocast(None) and enabled=False run every layer in its own dtype, as no context."""
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    a, b = _model(), _model()
    with context():  # type: ignore[operator]
        ya = a(x)
    yb = b(x)
    assert ya.dtype == F32 and ya.tobytes() == yb.tobytes()
    g = np.ones_like(ya)
    assert a.backward(g).tobytes() == b.backward(g).tobytes()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad.tobytes() == pb.grad.tobytes()  # type: ignore[union-attr]


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
@pytest.mark.parametrize("activation", ["gelu", "tanh", "relu"])
def test_outputs_and_saved_tensors_are_real_lp_arrays_and_master_weights_stay(
        fmt: str, activation: str) -> None:
    """Inside autocast: the output and every saved tensor are fmt arrays (2 bytes); the
    parameter gradients are float32 holding fmt values; weights are not rounded in place."""
    model = _model(activation, dropout=0.3)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with amp.autocast(fmt):
        y = model(np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32))
    assert y.dtype == numpy_dtype(fmt)
    saved = model.tape()
    assert {s.name for s in saved} >= {"input", "weight", "mask"}
    assert all(s.dtype == fmt and s.nbytes == 2 * int(np.prod(s.shape)) for s in saved), saved
    dx = model.backward(np.random.default_rng(3).standard_normal(y.shape).astype(np.float32))
    assert dx.dtype == F32 and np.array_equal(dx, quantize(dx, fmt))  # ToCopyBackward0
    for name, p in model.named_parameters():
        assert np.array_equal(p.data, before[name]), name
        assert p.grad is not None and p.grad.dtype == F32, name
        assert np.array_equal(p.grad, quantize(p.grad, fmt)), name
    assert model.tape() == []  # backward consumed every saved tensor


@settings(examples(40))
@given(fmt=st.sampled_from(["bfloat16", "float16"]), data=st.data())
def test_cast_is_round_to_nearest_even_like_ml_dtypes_and_numpy(fmt: str,
                                                                data: st.DataObject) -> None:
    """amp.cast (reference.formats' rounding) gives the bits of ml_dtypes' / NumPy's own
    float32 -> fmt conversion, including ties, overflow to inf, subnormals and signed zeros;
    widening back is exact."""
    words = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
    x = np.array(words, dtype=np.uint32).view(np.float32)
    x = x[~np.isnan(x)]  # NaN payloads are not specified by either
    tie_bit = 1 << (22 - (7 if fmt == "bfloat16" else 10))
    event("a tie" if np.any((x.view(np.uint32) & (2 * tie_bit - 1)) == tie_bit) else "no tie")
    mine = amp.cast(x, numpy_dtype(fmt))
    assert mine.dtype == numpy_dtype(fmt)
    with np.errstate(over="ignore"):
        theirs = x.astype(numpy_dtype(fmt))
    assert mine.view(np.uint16).tobytes() == theirs.view(np.uint16).tobytes()
    assert np.array_equal(amp.cast(mine, F32), quantize(x, fmt), equal_nan=True)


@settings(examples(30))
@given(fmt=st.sampled_from(["bfloat16", "float16"]),
       activation=st.sampled_from(["gelu", "tanh", "relu"]), seed=st.integers(0, 2**32 - 1))
def test_backward_rounds_the_incoming_gradient_first(fmt: str, activation: str,
                                                     seed: int) -> None:
    """backward(g) and backward(q(g)) give the same bits: a float32 gradient reaching an lp
    output is rounded to lp first (autograd's validate_outputs casts it)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    g = rng.standard_normal((4, 3)).astype(np.float32)  # 24 significant bits: not lp
    assert not np.array_equal(g, quantize(g, fmt)), "the gradient must need the rounding"
    results = []
    for grad in (g, quantize(g, fmt)):
        model = _model(activation)
        with amp.autocast(fmt):
            model(x)
        results.append([model.backward(grad), *(p.grad for p in model.parameters())])
    for a, b in zip(*results, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_linear_is_the_lp_operands_product_rounded_once(fmt: str) -> None:
    """y = q(q(x) q(W)^T + q(b)) within 1 lp ulp of the float64 product rounded once."""
    rng = np.random.default_rng(3)
    layer = rnn.Linear(32, 8, rng=rng)
    x = rng.standard_normal((10, 32)).astype(np.float32)
    with amp.autocast(fmt):
        y = layer(x).astype(np.float32)
    exact = (quantize(x, fmt).astype(np.float64) @ quantize(layer.weight.data, fmt).T
             + quantize(layer.bias.data, fmt))  # type: ignore[union-attr]
    assert ulp_distance(y, quantize(exact, fmt), fmt).max() <= 1


def test_contexts_nest_restore_and_reenter_a_recorded_state() -> None:
    """An inner context wins (enabled=False turns autocast off), exit restores the outer one
    (also on an exception), and `entering(state)` reproduces a recorded state."""
    assert amp.autocast_state() == amp.AutocastState()
    with amp.autocast("float16", "cuda") as outer:
        assert amp.autocast_state() == outer == amp.AutocastState(True, "float16", "cuda")
        with amp.autocast("bfloat16", enabled=False):
            assert not amp.autocast_state().enabled
            assert amp.decide("linear", F32).result == F32
        with pytest.raises(KeyError), amp.autocast("bfloat16"):
            assert amp.autocast_state().dtype == "bfloat16"
            raise KeyError("inside")
        recorded = amp.autocast_state()
    assert amp.autocast_state() == amp.AutocastState()
    with amp.autocast.entering(recorded):
        assert amp.autocast_state() == recorded


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_a_checkpoint_recomputes_under_the_state_its_forward_ran_in(fmt: str) -> None:
    """A ScheduledRun built outside autocast, run forward inside it and backward inside a
    context of the other lp dtype: the gradients of the plain autocast run, bit for bit."""
    other = {"bfloat16": "float16", "float16": "bfloat16"}[fmt]
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    g = np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32)
    plain, checkpointed = _model("gelu", 0.3), _model("gelu", 0.3)
    with amp.autocast(fmt):
        plain(x)
    plain.backward(g)
    n = len(checkpointed)  # one checkpoint around the whole model, Dropout included
    run = recompute.ScheduledRun(checkpointed, recompute.Schedule(
        "checkpoint", n, (recompute.Segment(0, n, tuple(range(n))),)))
    with amp.autocast(fmt):
        run.forward(x)
    with amp.autocast(other):
        run.backward(g)
    assert run.recomputed()[2] == 1, "the Dropout was not recomputed"
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert a.grad.tobytes() == b.grad.tobytes()  # type: ignore[union-attr]


@pytest.mark.parametrize(("device", "dtype", "op", "inputs", "expected"), [
    ("cpu", "bfloat16", "linear", (F32, F32), ("bfloat16", F32, "bfloat16")),
    ("cpu", "float16", "linear", (F64, F64), (numpy_dtype("float16"), F64, F64)),  # not eligible
    ("cpu", "bfloat16", "mse_loss", ("bfloat16", F32), (F32, F32, F32)),
    ("cpu", "bfloat16", "gelu", ("bfloat16",), (None, F32, "bfloat16")),
    ("cpu", "bfloat16", "mul", ("bfloat16", F32), (None, F32, F32)),  # promotion
    ("cpu", "float16", "mul", ("float16", "bfloat16"), (None, F32, F32)),
    ("cpu", "bfloat16", "softmax", ("bfloat16",), (None, F32, "bfloat16")),
    ("cuda", "bfloat16", "softmax", ("bfloat16",), (F32, F32, F32)),
    ("cuda", "float16", "layer_norm", ("float16",), (F32, F32, F32)),
    ("cpu", "float16", "mv", (F32, F32), (None, F32, F32)),
    ("cuda", "float16", "mv", (F32, F32), ("float16", F32, "float16")),
    ("cuda", "float16", "cross_entropy_loss", ("float16",), (None, F32, "float16")),
    ("cuda", "float16", "log_softmax", ("float16",), (F32, F32, F32)),
])
def test_decide_casts_by_the_lists_and_promotes_like_torch(
        device: str, dtype: str, op: str, inputs: tuple, expected: tuple) -> None:
    """The one policy: (cast, compute, result) per device list; unlisted ops promote."""
    def as_dtype(d: object) -> np.dtype | None:
        return numpy_dtype(d) if isinstance(d, str) else d  # type: ignore[return-value]

    with amp.autocast(dtype, device):
        got = amp.decide(op, *map(as_dtype, inputs))
    assert (got.cast, got.compute, got.result) == tuple(map(as_dtype, expected))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cross_entropy_runs_in_float32_on_both_device_lists(device: str) -> None:
    """CPU lists cross_entropy_loss as fp32, CUDA only its log_softmax: either way the loss
    saves float32 log-probabilities, returns a float32 loss and an lp input gradient."""
    logits = amp.cast(np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32),
                      numpy_dtype("float16"))
    loss_fn = rnn.CrossEntropyLoss()
    with amp.autocast("float16", device):
        loss = loss_fn(logits, np.arange(5) % 7)
    assert loss.dtype == F32 and loss_fn.saved_tensors()["result"].dtype == F32
    assert loss_fn.backward().dtype == numpy_dtype("float16")


def test_op_policies_follow_the_lists() -> None:
    """linear is lower_precision_fp on both devices, mv only on CUDA, cross_entropy_loss fp32
    only on CPU, softmax and layer_norm fp32 only on CUDA; activations are on no list; an
    unknown device type is refused."""
    assert [amp.op_policy("linear", d) for d in ("cpu", "cuda")] == ["lower_precision_fp"] * 2
    assert [amp.op_policy("mv", d) for d in ("cpu", "cuda")] == [None, "lower_precision_fp"]
    assert [amp.op_policy("cross_entropy_loss", d) for d in ("cpu", "cuda")] == ["fp32", None]
    assert [amp.op_policy("softmax", d) for d in ("cpu", "cuda")] == [None, "fp32"]
    assert [amp.op_policy("layer_norm", d) for d in ("cpu", "cuda")] == [None, "fp32"]
    assert {amp.op_policy(op) for op in ("gelu", "tanh", "relu", "dropout")} == {None}
    assert amp.op_policy("ctc_loss") == "fp32"  # listed by its overloads
    with pytest.raises(ValueError, match="device_type must be one of"):
        amp.op_policy("linear", "xpu")


def test_bad_dtypes_and_devices_are_refused() -> None:
    """Unknown dtypes and device types are a ValueError naming what is accepted; a Linear
    whose cast input and weights differ (float64 input: not eligible) a TypeError."""
    with pytest.raises(ValueError, match="dtype must be None, 'float16' or 'bfloat16'"):
        amp.autocast("float8_e4m3fn")
    with pytest.raises(ValueError, match="device_type must be one of"):
        amp.autocast("float16", "mps")
    with pytest.raises(TypeError, match="expected float dtypes"):
        amp.decide("mul", np.dtype(np.int64))
    with amp.autocast("bfloat16"), pytest.raises(TypeError, match="input is float64"):
        _model()(np.ones((2, 6)))
