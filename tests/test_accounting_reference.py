"""The accounting formulas against their own oracles: the closed forms against an enumeration
of every GEMM, published parameter counts and figures, the approximations' exact distance,
and the MLP's recompute and tape counts against the reference's own run."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.strategies import examples
from parity.strategies.accounting import accounting_gpt_configs
from parity.strategies.recompute import recompute_models, recompute_specs
from reference import accounting as racc
from reference import flops as rflops
from reference import nn as ref
from reference import recompute as rrc
from reference.flops_published import flop_approximations


def _shape(cfg: dict) -> dict:
    return {k: cfg[k] for k in ("n_layer", "d_model", "n_head", "seq_len", "vocab", "batch",
                                "d_ff")}


# ---------------------------------------------------------------- the decoder's FLOPs
@given(cfg=accounting_gpt_configs())
def test_closed_form_equals_the_sum_over_every_gemm(cfg: dict) -> None:
    """transformer_flops and each phase of transformer_phase_flops equal the sum of 2 m n k
    over transformer_gemms' enumeration (per phase), for any decoder and recompute."""
    event(cfg["recompute"])
    gemms = rflops.transformer_gemms(**cfg)
    phases = rflops.transformer_phase_flops(**cfg)
    for phase in ("forward", "backward", "recompute"):
        assert sum(g.flops for g in gemms if g.phase == phase) == phases[phase], phase
    assert sum(g.flops for g in gemms) == rflops.transformer_flops(**cfg) == phases["total"]
    assert len([g for g in gemms if g.phase == "backward"]) == 2 * (6 * cfg["n_layer"] + 1)


@given(cfg=accounting_gpt_configs())
def test_forward_parts_are_the_gemms_grouped_by_kind(cfg: dict) -> None:
    """blocks = the four Linear GEMMs, attention = scores + att @ v, head = lm_head."""
    parts = rflops.transformer_forward_flops(**_shape(cfg))
    forward = [g for g in rflops.transformer_gemms(**_shape(cfg)) if g.phase == "forward"]
    attention = sum(g.flops for g in forward if g.name.endswith(("scores", "values")))
    head = sum(g.flops for g in forward if g.name == "lm_head")
    assert parts["attention"] == attention
    assert parts["head"] == head
    assert parts["blocks"] == sum(g.flops for g in forward) - attention - head
    assert parts["total"] == parts["blocks"] + parts["attention"] + parts["head"]


@given(cfg=accounting_gpt_configs())
def test_docstring_closed_forms_hold_exactly_for_d_ff_4h(cfg: dict) -> None:
    """72 B s L h^2 (1 + s/6h + V/12Lh), 96 (.. + V/16Lh), 88 (1 + 2s/11h + 3V/44Lh)."""
    cfg = {**_shape(cfg), "d_ff": None}
    b, s, n, h, v = cfg["batch"], cfg["seq_len"], cfg["n_layer"], cfg["d_model"], cfg["vocab"]
    lead = b * s * n * h * h
    expected = {
        "none": 72 * lead * (1 + Fraction(s, 6 * h) + Fraction(v, 12 * n * h)),
        "full": 96 * lead * (1 + Fraction(s, 6 * h) + Fraction(v, 16 * n * h)),
        "full_early_stop": 88 * lead * (1 + Fraction(2 * s, 11 * h) + Fraction(3 * v, 44 * n * h)),
    }
    for recompute, value in expected.items():
        assert rflops.transformer_flops(**cfg, recompute=recompute) == value, recompute


@given(cfg=accounting_gpt_configs())
def test_recompute_reruns_the_blocks_and_early_stop_skips_only_the_last_gemm(cfg: dict) -> None:
    """full - none = the blocks' forward; full - full_early_stop = every mlp.c_proj when
    dropout is 0, and nothing when a dropout mask is the block's last save."""
    cfg = _shape(cfg)
    parts = rflops.transformer_forward_flops(**cfg)
    f = cfg["d_ff"] or 4 * cfg["d_model"]
    none, full = (rflops.transformer_flops(**cfg, recompute=r) for r in ("none", "full"))
    assert full - none == parts["blocks"] + parts["attention"]
    early = rflops.transformer_flops(**cfg, recompute="full_early_stop")
    assert full - early == cfg["n_layer"] * 2 * cfg["batch"] * cfg["seq_len"] * f * cfg["d_model"]
    assert rflops.transformer_flops(**cfg, recompute="full_early_stop", dropout=0.1) == full


def test_gpt2_parameter_counts_are_the_published_ones() -> None:
    """GPT-2 small / medium / large / XL (tied head, V 50257, 1024 positions): 124,439,808,
    354,823,168, 774,030,080 and 1,557,611,200 parameters (the Hugging Face checkpoints)."""
    published = {(12, 768): 124_439_808, (24, 1024): 354_823_168, (36, 1280): 774_030_080,
                 (48, 1600): 1_557_611_200}
    for (n_layer, width), count in published.items():
        assert rflops.gpt_param_count(n_layer, width, 50257, 1024, tie_weights=True) == count
    assert (rflops.gpt_param_count(12, 768, 50257, 1024) - 124_439_808) == 50257 * 768


@given(cfg=accounting_gpt_configs(max_layers=8), bias=st.booleans(), tie=st.booleans(),
       block=st.integers(1, 4096))
def test_parameter_count_is_the_sum_of_the_named_shapes(cfg: dict, bias: bool, tie: bool,
                                                        block: int) -> None:
    """gpt_param_count == the sum over gpt_param_shapes (nanoGPT's names); a tied head and
    bias=False leave out exactly lm_head.weight and every .bias."""
    args = (cfg["n_layer"], cfg["d_model"], cfg["vocab"], block, cfg["d_ff"], bias, tie)
    shapes = rflops.gpt_param_shapes(*args)
    assert rflops.gpt_param_count(*args) == sum(math.prod(s) for s in shapes.values())
    assert ("lm_head.weight" in shapes) == (not tie)
    assert any(name.endswith(".bias") for name in shapes) == bias
    assert len(shapes) == 2 + cfg["n_layer"] * (12 if bias else 6) + (2 if bias else 1) + \
        (0 if tie else 1)


# ---------------------------------------------------------------- the approximations
@given(cfg=accounting_gpt_configs())
def test_each_approximation_differs_from_the_exact_count_by_its_named_terms(cfg: dict) -> None:
    """Kaplan's 6ND misses attention's 12 B s^2 h L and the head's 6 B s h V; PaLM's N adds
    the gathered wte and the biases and LayerNorms (6 tokens (V h + L (9h + f) + 2h)) to an
    otherwise exact count; Chinchilla adds an embedding matmul and softmax's 3 a s^2."""
    shape = _shape(cfg)
    b, s, n, h, a, v = (shape[k] for k in ("batch", "seq_len", "n_layer", "d_model", "n_head",
                                           "vocab"))
    f = shape["d_ff"] or 4 * h
    by_name = {x.name: x for x in flop_approximations(**shape)}
    assert -by_name["Kaplan 2020"].difference == 12 * b * s * s * h * n + 6 * b * s * h * v
    assert by_name["PaLM 2022"].difference == 6 * b * s * (v * h + n * (9 * h + f) + 2 * h)
    assert by_name["Chinchilla 2022"].difference == 3 * b * (2 * s * v * h + 3 * a * s * s * n)
    for x in by_name.values():
        assert x.exact == rflops.transformer_flops(**shape)
        assert x.relative == Fraction(x.difference, x.exact)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(("change", "says"), [
    ({"n_head": 5}, "divisors of d_model"), ({"d_model": 0}, "positive integer"),
    ({"seq_len": -3}, "positive integer"), ({"batch": True}, "positive integer"),
    ({"vocab": 2.0}, "positive integer"), ({"d_ff": 0}, "positive integer"),
    ({"recompute": "selective"}, "'full_early_stop'"), ({"dropout": 1.5}, "[0, 1]"),
])
def test_bad_decoder_configurations_raise_naming_what_is_accepted(change: dict, says: str
                                                                   ) -> None:
    cfg = {"n_layer": 2, "d_model": 64, "n_head": 4, "seq_len": 16, "vocab": 100, "batch": 2}
    with pytest.raises(ValueError) as info:
        rflops.transformer_flops(**{**cfg, **change})
    assert says in str(info.value)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"optimizer": "lion"}, "'adamw'"), ({"precision": "fp8"}, "'bf16_mixed'"),
    ({"optimizer_state_dtype": "bf16"}, "'default'"), ({"master_weights": True}, "master copy"),
])
def test_bad_memory_arguments_raise_naming_what_is_accepted(kwargs: dict, says: str) -> None:
    args = {"optimizer": "adam", "precision": "fp32", "master_weights": False, **kwargs}
    with pytest.raises(ValueError) as info:
        racc.training_memory(1000, **args)
    assert says in str(info.value)


def test_bad_sizes_and_recompute_modes_raise_naming_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="positive integer"):
        racc.training_memory(0, optimizer="adam", precision="fp32", master_weights=False)
    with pytest.raises(ValueError, match="divisors of hidden"):
        racc.activation_bytes(seq_len=8, batch=1, hidden=10, n_head=3, n_layer=1)
    with pytest.raises(ValueError, match="'selective'"):
        racc.activation_bytes(seq_len=8, batch=1, hidden=12, n_head=3, n_layer=1,
                              recompute="full_early_stop")


# ---------------------------------------------------------------- training state
def test_training_memory_gives_the_published_bytes_per_parameter() -> None:
    """ZeRO (Rajbhandari et al. 2020): mixed-precision Adam holds 2 + 2 + 12 = 16 bytes per
    parameter (fp16 weights and grads, fp32 master, momentum, variance); plain fp32 Adam
    also 16; a float32 accumulation buffer adds 4; SGD without state 8."""
    mixed = racc.training_memory(10**9, optimizer="adam", precision="fp16_mixed",
                                 master_weights=True)
    assert (mixed["weights"], mixed["grads"], mixed["master"] + mixed["optimizer_state"]) == \
        (2 * 10**9, 2 * 10**9, 12 * 10**9)
    assert mixed["bytes_per_param"] == 16 and mixed["total"] == 16 * 10**9
    assert racc.training_memory(7, optimizer="adamw", precision="fp32",
                                master_weights=False)["bytes_per_param"] == 16
    assert racc.training_memory(7, optimizer="adam", precision="bf16_mixed", master_weights=True,
                                grad_buffer=True)["bytes_per_param"] == 20
    assert racc.training_memory(7, optimizer="sgd", precision="fp32",
                                master_weights=False)["bytes_per_param"] == 8


@given(n=st.integers(1, 10**12), optimizer=st.sampled_from(tuple(racc.OPTIMIZERS)),
       precision=st.sampled_from(tuple(racc.PRECISIONS)), master=st.booleans(),
       state=st.sampled_from(racc.STATE_DTYPES), buffer=st.booleans())
def test_training_memory_categories_add_up_and_follow_the_state_dtype_rule(
        n: int, optimizer: str, precision: str, master: bool, state: str, buffer: bool) -> None:
    """total = the categories' sum = bytes_per_param n; optimizer state is states x (4 with
    a master copy, fp32 weights or "fp32", else 2)."""
    master = master and precision != "fp32"
    mem = racc.training_memory(n, optimizer=optimizer, precision=precision,
                               master_weights=master, optimizer_state_dtype=state,
                               grad_buffer=buffer)
    parts = ("weights", "grads", "master", "grad_buffer", "optimizer_state")
    assert mem["total"] == sum(mem[k] for k in parts) == mem["bytes_per_param"] * n
    width = 4 if (master or precision == "fp32" or state == "fp32") else 2
    assert mem["optimizer_state"] == racc.OPTIMIZERS[optimizer] * width * n
    assert racc.project_precisions(precision, master) == (
        racc.PROJECT_PRECISIONS if (precision, master) == ("fp32", False) else ())


# ---------------------------------------------------------------- Korthikanti et al. 2022
def test_korthikanti_published_figures() -> None:
    """GPT-3 175B (a 96, s 2048, h 12288): 5as/h = 80, so selective recompute saves 80/114,
    "70%"; MT-NLG 530B (a 128, h 20480): 5as/h = 64, 64/98, "65%"."""
    for a, h, ratio, saved in ((96, 12288, 80, 70), (128, 20480, 64, 65)):
        s, b = 2048, 1
        none = racc.activation_bytes(seq_len=s, batch=b, hidden=h, n_head=a, n_layer=1)
        selective = racc.activation_bytes(seq_len=s, batch=b, hidden=h, n_head=a, n_layer=1,
                                          recompute="selective")
        assert Fraction(none, s * b * h) == 34 + ratio
        assert round(100 * Fraction(none - selective, none)) == saved


@given(cfg=accounting_gpt_configs())
def test_korthikanti_terms_sum_to_the_closed_form(cfg: dict) -> None:
    """The 13 terms sum to s b h (34 + 5 a s / h) per layer; selective keeps 34 s b h, full
    2 s b h; all times n_layer."""
    s, b, h, a, n = (cfg[k] for k in ("seq_len", "batch", "d_model", "n_head", "n_layer"))
    terms = racc.korthikanti_terms(seq_len=s, batch=b, hidden=h, n_head=a)
    assert Fraction(sum(terms.values())) == s * b * h * (34 + Fraction(5 * a * s, h))
    got = {r: racc.activation_bytes(seq_len=s, batch=b, hidden=h, n_head=a, n_layer=n,
                                    recompute=r) for r in racc.KORTHIKANTI_RECOMPUTE}
    assert got == {"none": n * sum(terms.values()), "selective": n * 34 * s * b * h,
                   "full": n * 2 * s * b * h}


# ---------------------------------------------------------------- the MLP, against its run
@given(case=recompute_models(), data=st.data())
@settings(examples(40))
def test_recompute_runs_predict_the_reference_schedules_counts(case: dict,
                                                               data: st.DataObject) -> None:
    """recompute_runs(plan) == the reference ScheduledRun's recomputed() and interrupted()
    counts, layer by layer, for any schedule (early stop: torch's default)."""
    model = ref.make_mlp(case["sizes"], case["activation"], case["dropout"],
                         rng=np.random.default_rng(case["seed"]), dtype=case["dtype"])
    spec = data.draw(recompute_specs(len(model)))
    event(spec.partition(":")[0])
    x = np.ones((case["batch"], case["sizes"][0]), dtype=case["dtype"])
    run = rrc.forward_with_schedule(model, x, spec)
    run.backward(np.ones(run.output.shape, dtype=case["dtype"]))
    started, cut = rflops.recompute_runs(rrc.parse_schedule(spec, len(model)).plan,
                                         [True] * len(model))
    assert started == run.recomputed()
    assert cut == run.interrupted()


@given(case=recompute_models(), data=st.data())
@settings(examples(40))
def test_mlp_flops_and_held_bytes_agree_with_the_reference_run(case: dict,
                                                               data: st.DataObject) -> None:
    """The reference run's own GEMM count (run_flops) and held tape bytes equal mlp_flops (+
    the first dx and the cut GEMMs) and mlp_activation_bytes; after a plain forward,
    tape_flops equals the forward."""
    model = ref.make_mlp(case["sizes"], case["activation"], case["dropout"],
                         rng=np.random.default_rng(case["seed"]), dtype=case["dtype"])
    spec = data.draw(recompute_specs(len(model)))
    sizes, batch, itemsize = case["sizes"], case["batch"], np.dtype(case["dtype"]).itemsize
    kw = {"activation": case["activation"], "dropout": case["dropout"]}
    x = np.ones((batch, sizes[0]), dtype=case["dtype"])
    run = rrc.forward_with_schedule(model, x, spec)
    assert run.held_bytes == racc.mlp_activation_bytes(sizes, batch, itemsize=itemsize,
                                                       recompute=spec, **kw)
    if spec == "none":
        assert racc.tape_flops(model) == rflops.mlp_flops(sizes, batch, **kw)["forward"]
    run.backward(np.ones(run.output.shape, dtype=case["dtype"]))
    mine = racc.run_flops(run)
    theirs = rflops.mlp_flops(sizes, batch, recompute=spec, input_requires_grad=True, **kw)
    assert (mine["forward"], mine["backward"], mine["recompute"] - mine["cut"]) == \
        (theirs["forward"], theirs["backward"], theirs["recompute"])


def test_mlp_formulas_reject_bad_input_naming_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="'gelu_tanh'"):
        rflops.mlp_flops((3, 4), 2, activation="swish")
    with pytest.raises(ValueError, match="positive integer"):
        rflops.mlp_flops((3, 0, 2), 2)
    with pytest.raises(ValueError, match="optimal:S"):
        rflops.mlp_flops((3, 4, 2), 2, recompute="full")
    with pytest.raises(ValueError, match="'fp16'"):
        racc.mlp_activation_bytes((3, 4), 2, precision="fp16_mixed")


# ---------------------------------------------------------------- the transformer's saves
GPT_SMALL_LAYER = {"n_layer": 1, "d_model": 768, "n_head": 12, "seq_len": 1024,
                   "vocab": 50257, "batch": 8}


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"precision": "bf16", "device": "cuda"}, "not modelled"),
    ({"itemsize": 2}, "itemsize must be 4"),
    ({"n_head": 5}, "divisors of d_model"),
    ({"precision": "bf16_mixed"}, "'fp16'"),
    ({"recompute": "selective"}, "'full_early_stop'"),
])
def test_gpt_activation_bytes_rejects_what_it_does_not_model(kwargs: dict, says: str) -> None:
    from reference import accounting_gpt as ragpt

    args = {**GPT_SMALL_LAYER, "d_model": 12, "n_head": 3, "seq_len": 4, "vocab": 5, **kwargs}
    with pytest.raises(ValueError, match=says):
        ragpt.gpt_activation_bytes(**args)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_korthikanti_table_covers_every_save_of_the_block_once(dropout: float) -> None:
    """The docs' Korthikanti-vs-ours table groups block 0's saves; its total == the
    formula's bytes of one block (nothing dropped, nothing counted twice), and with dropout
    every Korthikanti term has a tensor of ours."""
    from parity.lab.gendocs import accounting_gpt as gdoc
    from reference import accounting_gpt as ragpt

    groups = gdoc.block_terms(dropout=dropout)
    total = sum(e.nbytes for group in groups.values() for e in group)
    one_block = ragpt.gpt_activation_bytes(**gdoc.SHAPE, dropout=dropout, precision="bf16")
    assert total == one_block["blocks"]
    empty = {name for name, group in groups.items() if not group}
    assert empty == (set() if dropout else {"attention: softmax dropout mask",
                                            "attention: dropout output (att @ v input)",
                                            "attention: residual dropout mask",
                                            "mlp: dropout mask"})


@pytest.mark.parametrize("kw", [
    {"precision": "fp32", "recompute": "none", "dropout": 0.0, "bias": True},
    {"precision": "bf16", "recompute": "full", "dropout": 0.1, "bias": False},
    {"precision": "fp16", "recompute": "full_early_stop", "dropout": 0.0, "bias": True},
    {"precision": "fp32", "recompute": "none", "dropout": 0.2, "bias": True,
     "device": "cuda"},
])
def test_the_depth_extension_equals_enumerating_every_block(
        kw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Depth is affine ]: the held bytes extended from two and three blocks equal the
    enumeration of every block's saves at each depth up to 12."""
    from reference import accounting_gpt as ragpt

    shape = {"d_model": 12, "n_head": 3, "seq_len": 5, "vocab": 11, "batch": 2}
    extended = [ragpt.gpt_activation_bytes(n_layer=n, **shape, **kw) for n in range(1, 13)]
    monkeypatch.setattr(ragpt, "AFFINE_FROM", 100)  # every depth enumerated
    assert [ragpt.gpt_activation_bytes(n_layer=n, **shape, **kw)
            for n in range(1, 13)] == extended


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie", [True, False])
def test_the_parameter_tensor_count_is_the_listed_tensors(bias: bool, tie: bool) -> None:
    for n_layer in (1, 2, 7):
        listed = rflops.gpt_param_shapes(n_layer, 8, 10, 6, bias=bias, tie_weights=tie)
        assert rflops.gpt_param_tensors(n_layer, bias, tie) == len(listed)
