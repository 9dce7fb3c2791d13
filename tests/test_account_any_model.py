"""account_module on any nn.Module (parity/lab/your_trainer/accounting_any.py): per-module
bytes and FLOPs of a conv net against their closed forms, a storage saved twice counted once,
the GPT-2 recognizer on this project's transformer (no named term: it IS the formulas' model) and on
transformers' GPT2LMHeadModel (each difference a named term, residual 0), and the refusals.

transformers is an optional oracle (the `oracles` extra, which CI installs): its tests skip,
saying so, without it. Its import (about 2 s once torch is loaded) is paid once per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from common.gpt_config import GPTConfig
from examples.models import convnet
from parity.lab import account_any as lab
from parity.lab.cli import EXIT_OK, EXIT_USAGE, main
from parity.lab.your_trainer.accounting_any import NotGPT2, account_module, gpt2_shape
from reference.accounting_gpt import gpt_activation_bytes
from reference.flops import gpt_param_count, transformer_flops, transformer_forward_flops
from torch_impl.gpt import GPT

B, T = 2, 8  # sequences, tokens
GPT_SHAPE = {"n_layer": 2, "d_model": 32, "n_head": 4, "seq_len": T, "vocab": 24, "batch": B}


def _our_gpt(tie: bool) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    cfg = GPTConfig(vocab_size=24, block_size=16, n_layer=2, n_head=4, n_embd=32,
                    tie_weights=tie)
    idx = torch.randint(0, 24, (B, T), generator=g)
    return GPT(cfg, generator=g), (idx, torch.roll(idx, -1, 1))  # targets: their own storage


@pytest.mark.parametrize("tie", [False, True])
def test_our_transformer_is_recognized_and_equals_the_closed_forms_with_no_term(
        tie: bool) -> None:
    """This project's GPT is what the formulas describe: measured parameters, FLOPs and saved
    bytes equal gpt_param_count, transformer_flops and gpt_activation_bytes exactly."""
    model, batch = _our_gpt(tie)
    account = account_module(model, batch)
    shape = gpt2_shape(model, batch)
    assert (shape.n_layer, shape.d_model, shape.n_head, shape.d_ff, shape.vocab,
            shape.tied, shape.layout) == (2, 32, 4, 128, 24, tie, "linear")
    lines = {ln.name: ln for ln in lab.gpt2_lines(shape, account)}
    assert lines["parameters"].measured == gpt_param_count(2, 32, 24, 16, tie_weights=tie)
    assert lines["flops"].measured == transformer_flops(**GPT_SHAPE)
    assert lines["activations"].measured == gpt_activation_bytes(**GPT_SHAPE)["total"]
    assert all(not lines[n].terms and lines[n].residual == 0 for n in lab.RECONCILED)


def test_with_dropout_the_activation_rows_are_left_out_and_the_rest_reconciles() -> None:
    """Dropout 0.1: parameters and FLOPs still equal their formulas; the activation rows are
    left out, saying why (their terms are stated for p == 0)."""
    g = torch.Generator().manual_seed(0)
    cfg = GPTConfig(vocab_size=24, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.1)
    model = GPT(cfg, generator=g)
    idx = torch.randint(0, 24, (B, T), generator=g)
    batch = (idx, torch.roll(idx, -1, 1))
    lines, note = lab.try_gpt2(model, batch, account_module(model, batch))
    assert [(ln.name, ln.residual) for ln in lines if ln.name in lab.RECONCILED] == [
        ("parameters", 0), ("flops", 0)]
    assert "dropout 0.1" in note


def test_a_storage_saved_by_two_ops_counts_once() -> None:
    """idx passed as its own targets: the embedding's indices and the loss's target are one
    storage, held once: B T 8 bytes fewer than the formula, which counts two tensors."""
    model, (idx, _) = _our_gpt(False)
    account = account_module(model, (idx, idx))
    assert sum(account.activations.values()) == (
        gpt_activation_bytes(**GPT_SHAPE)["total"] - B * T * 8)


def test_the_conv_net_per_module_against_its_closed_forms() -> None:
    """Conv2d(3->8, 3x3) -> BatchNorm -> ReLU -> Linear(512->10) on N=4 images 8x8: each
    module's bytes and forward FLOPs by hand; fc's input (a view of ReLU's saved result)
    counts once, at ReLU; the step's FLOPs: the conv's backward only dW (its input needs no
    grad), fc's dX and dW."""
    model, x, loss_fn = convnet((4, 8))
    opt = torch.optim.AdamW(model.parameters())
    a = account_module(model, x, loss_fn=loss_fn, optimizer=opt)
    N, C, S, K = 4, 8, 8, 3
    conv_p, fc_p = C * 3 * K * K + C, C * S * S * 10 + 10
    assert a.params == {"conv": 4 * conv_p, "bn": 4 * 2 * C, "fc": 4 * fc_p}
    assert a.grads == a.params
    assert a.optimizer_state == {"conv": 8 * conv_p + 2 * 4, "bn": 8 * 2 * C + 2 * 4,
                                 "fc": 8 * fc_p + 2 * 4}  # exp_avg, exp_avg_sq; step per tensor
    assert a.buffers == {"bn": 4 * 2 * C + 8}  # running mean, var; num_batches_tracked
    image = N * C * S * S * 4
    assert a.activations == {"conv": N * 3 * S * S * 4, "bn": image + 2 * C * 4,
                             "relu": image, "(outside)": N * 10 * 4 + N * 8 + 4}
    conv_f, fc_f = 2 * N * C * S * S * 3 * K * K, 2 * N * C * S * S * 10
    assert {p: a.flops_forward[p] for p in ("conv", "fc", "")} == {
        "conv": conv_f, "fc": fc_f, "": conv_f + fc_f}
    assert a.total_flops == 2 * conv_f + 3 * fc_f


class _WithClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt, _ = _our_gpt(False)
        self.classify = nn.Linear(32, 2)


@pytest.mark.parametrize(("make", "says"), [
    (lambda: (convnet()[0], torch.zeros(1, 3, 8, 8)), "rule 1"),
    (lambda: (_WithClassifier(), _our_gpt(False)[1]), "rule 4"),
    (lambda: (_our_gpt(False)[0], (torch.zeros(2, 8),)), "rule 6"),
    (lambda: (_our_gpt(False)[0], (torch.zeros(1, 17, dtype=torch.int64),)), "rule 6"),
])
def test_the_recognizer_names_the_rule_a_model_breaks(make: object, says: str) -> None:
    """Not GPT-2-shaped: NotGPT2 (a ValueError) naming the rule of NOTE [ Recognizing ... ]."""
    model, batch = make()  # type: ignore[operator]
    with pytest.raises(NotGPT2, match=says):
        gpt2_shape(model, batch)


def test_account_module_rejects_what_it_cannot_measure() -> None:
    model, x, _ = convnet()
    with pytest.raises(TypeError, match=r"nn\.Module"):
        account_module(lambda t: t, x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot find the loss"):
        account_module(model, x)


def test_the_cli_measures_a_factory_and_refuses_a_bad_spec(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--module examples.models:convnet --json: the totals; a spec without ':' is a
    one-line usage error."""
    status = main(["account", "--module", "examples.models:convnet", "--batch-shape", "4,8",
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == EXIT_OK and report["gpt2"] is None and "rule 1" in report["not_gpt2"]
    assert report["totals"]["activations"] == 3072 + 8256 + 8192 + 196
    status = main(["account", "--module", "examples.models"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE and "PKG.MOD:FACTORY" in err and len(err.splitlines()) == 1
    status = main(["account", "--model", "mlp", "--batch-shape", "2,3"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE and "goes with --module" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------- transformers' GPT-2
@pytest.fixture(scope="module")
def hf() -> object:
    return pytest.importorskip("transformers", reason="transformers is an optional oracle")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_transformers_gpt2_reconciles_with_every_difference_named(
        hf: object, attention: str) -> None:
    """GPT2LMHeadModel(n_layer 2, n_embd 64, n_head 4, V 128, 32 positions): parameters equal
    gpt_param_count (tied, Conv1D layout); FLOPs equal transformer_flops, less the attention
    core under SDPA (uncounted on the CPU); saved bytes equal gpt_activation_bytes plus the
    named terms, each its closed form (NOTE [ GPT-2 beside the closed forms ])."""
    from examples.models import tiny_gpt2

    model, batch = tiny_gpt2((B, T), attention=attention)
    account = account_module(model, batch)
    shape = gpt2_shape(model, batch)
    assert (shape.layout, shape.tied, shape.fused_qkv, shape.n_positions) == (
        "conv1d", True, True, 32)
    lines = {ln.name: ln for ln in lab.gpt2_lines(shape, account)}
    L, h, a, f, e = 2, 64, 4, 256, 4
    cfg = {"n_layer": L, "d_model": h, "n_head": a, "seq_len": T, "vocab": 128, "batch": B}
    assert lines["parameters"].measured == gpt_param_count(L, h, 128, 32, tie_weights=True)
    core = transformer_forward_flops(**cfg)["attention"]
    assert lines["flops"].measured == transformer_flops(**cfg) - (
        3 * core if attention == "sdpa" else 0)
    terms = {"no saved causal mask": -L * T * T,
             "composite GELU (4 saves)": 3 * L * B * T * f * e}
    if attention == "sdpa":
        terms["SDPA core (CPU flash kernel)"] = L * (4 * B * a * T - B * a * T * T * e)
    assert lines["activations"].terms == terms
    assert lines["activations"].measured == (gpt_activation_bytes(**cfg)["total"]
                                             + sum(terms.values()))
    assert all(lines[n].residual == 0 for n in lab.RECONCILED)


def test_gpt2_small_has_the_published_parameter_count(hf: object) -> None:
    """GPT2Config()'s model, built on the meta device: 124,439,808 parameters, the count
    gpt_param_count gives GPT-2 small (tied head)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    shape = gpt2_shape(model, {"input_ids": torch.zeros(1, 1024, dtype=torch.int64)})
    n = sum(p.numel() for p in model.parameters())
    assert n == gpt_param_count(shape.n_layer, shape.d_model, shape.vocab, shape.n_positions,
                                tie_weights=shape.tied) == 124_439_808


def test_the_factorys_module_is_found_in_the_current_folder_as_resume_check_finds_it(
        tmp_path: Path) -> None:
    """`python -m parity account --module mymodels:convnet` run where mymodels.py is: the
    command imports it from the current folder (before, only resume-check did)."""
    source = Path(__file__).resolve().parents[1] / "examples" / "models.py"
    (tmp_path / "mymodels.py").write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "parity", "account", "--module",
                           "mymodels:convnet", "--batch-shape", "4,8", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(source.parents[1])})
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert json.loads(done.stdout)["totals"]["activations"] == 3072 + 8256 + 8192 + 196


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm (its model.py): an optional bias, F.layer_norm."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def test_nanogpts_own_layernorm_class_is_a_layernorm_and_the_model_reconciles() -> None:
    """Our GPT with every nn.LayerNorm swapped for nanoGPT's own class (the same F.layer_norm):
    still GPT-2-shaped, and every line equals its closed form with no term; before, rule 2
    refused it, and its attention core's FLOPs went unaccounted."""
    model, batch = _our_gpt(False)
    for path, m in list(model.named_modules()):
        if isinstance(m, nn.LayerNorm):
            parent, _, name = path.rpartition(".")
            swapped = LayerNorm(m.normalized_shape[0], bias=m.bias is not None)
            swapped.load_state_dict(m.state_dict())
            setattr(model.get_submodule(parent) if parent else model, name, swapped)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    account = account_module(model, batch)
    shape = gpt2_shape(model, batch)
    lines = {ln.name: ln for ln in lab.gpt2_lines(shape, account)}
    assert lines["flops"].measured == transformer_flops(**GPT_SHAPE)
    assert lines["activations"].measured == gpt_activation_bytes(**GPT_SHAPE)["total"]
    assert all(not lines[n].terms and lines[n].residual == 0 for n in lab.RECONCILED)
