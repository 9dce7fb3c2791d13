"""One training step of the compact transformer, predicted and measured: torch_impl's GPT
under StepMeter (FlopCounterMode by phase, saved_tensors_hooks by region, the optimizer's
state) through torch_impl.train.train_step, whole-block recomputation by checkpointing each
block; the same shapes counted on the meta device (nothing allocated); the reference GPT's
arrays and tape (its bytes and its own GEMM count); the sheet's rows and the named gaps.

Here the reference's tape is compared in float32/float64 with recompute "none" (its
recomputation and its autocast tape are held against torch's hooks by the recompute and gpt
topics, and the profile meters every schedule), its training state in every case.

    python -m parity.drivers.accounting_gpt    measures RECONCILED (the default transformer)
                                               into docs/data/accounting_gpt.json
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from parity.drivers.accounting import OPTIMIZERS, GPTCase, Row
from reference import accounting as racc
from reference import accounting_gpt as ragpt
from reference.gpt import GPTConfig
from torch_impl.train_models import NextTokenLoss

SCALE = 2.0**8  # fp16's initial loss scale: 2^16 overflows the tiny models' first step
REFERENCE_GPT_LIMITS = ("the reference transformer's tape under autocast is held to torch's "
                        "hooks by gpt.autocast_saved_tensors; here it is compared in fp32 "
                        "without recompute only")


def config_of(case: GPTCase) -> GPTConfig:
    """The model's GPTConfig (block_size: the case's, else seq_len; d_ff is 4 d_model)."""
    if case.d_ff not in (None, 4 * case.d_model):
        raise ValueError(f"d_ff={case.d_ff}: the compact transformer's MLP is 4 d_model wide "
                         f"({4 * case.d_model}); accepted for a measured step: d_ff None")
    if case.precision not in racc.PROJECT_PRECISIONS:
        raise ValueError(f"precision {case.precision!r}: the transformer trains under "
                         f"autocast; accepted for a measured step: {racc.PROJECT_PRECISIONS}")
    if not case.bias:
        raise ValueError("bias=False: this project's LayerNorms keep their bias (nanoGPT's "
                         "drop it, and so do gpt_param_shapes / gpt_param_count); accepted for "
                         "a measured step: bias True")
    if case.dropout >= 1.0:
        raise ValueError(f"dropout {case.dropout}: GPTConfig accepts [0, 1)")
    return GPTConfig(vocab_size=case.vocab, block_size=case.block_size or case.seq_len,
                     n_layer=case.n_layer, n_head=case.n_head, n_embd=case.d_model,
                     dropout=case.dropout, bias=case.bias, tie_weights=case.tie_weights)


def tokens(case: GPTCase, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (case.batch, case.seq_len)
    return (rng.integers(0, case.vocab, shape, dtype=np.int64),
            rng.integers(0, case.vocab, shape, dtype=np.int64))


def torch_gpt_step(case: GPTCase, device: str = "cpu", seed: int = 0) -> dict[str, object]:
    """One torch_impl.train.train_step of the GPT under StepMeter, each block checkpointed
    for "full" (early stop off) and "full_early_stop" (torch's default); fp16 starts at
    loss scale SCALE, so that the step is taken and the optimizer's state exists."""
    from torch_impl import accounting as tacc
    from torch_impl import gpt as tgpt
    from torch_impl import loss_scaling, train

    model = tgpt.GPT(config_of(case), generator=torch.Generator().manual_seed(seed),
                     device=device)
    cls, kw = OPTIMIZERS[case.optimizer]
    optimizer = getattr(torch.optim, cls)(model.parameters(), **kw)
    loss_fn = NextTokenLoss()
    idx, targets = (torch.from_numpy(a).to(device) for a in tokens(case, seed))
    blocks = list(model.transformer.h) if case.recompute != "none" else []
    with torch.random.fork_rng(devices=[]), \
            tacc.checkpointed(blocks, early_stop=case.recompute != "full"):
        torch.manual_seed(seed)
        with tacc.StepMeter(model, loss_fn=loss_fn, optimizer=optimizer, device=device) as m:
            result = train.train_step(model, loss_fn, optimizer,
                                      loss_scaling.make_scaler(case.precision, device,
                                                               init_scale=SCALE),
                                      idx, targets, precision=case.precision)
    return {"state": tacc.state_bytes(model, optimizer), "flops": m.flops.as_dict(),
            "held": {r: m.held(r) for r in ("model", "loss", "other")}, "cuda": m.cuda,
            "skipped": result.skipped}


# ---------------------------------------------------------------- the meta device
def meta_gpt(config: GPTConfig) -> nn.Module:
    """torch_impl's GPT with the same modules and names, built on the meta device and left
    there (GPT.__init__ materializes on the CPU to draw its init): shapes, no storage."""
    from torch_impl import gpt as tgpt

    model = tgpt.GPT.__new__(tgpt.GPT)
    nn.Module.__init__(model)
    model.config = config
    with torch.device("meta"):
        model.transformer = nn.ModuleDict(dict(
            wte=tgpt.empty_embedding(config.vocab_size, config.n_embd),
            wpe=tgpt.empty_embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([tgpt.Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd)))
        model.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
    if config.tie_weights:
        model.lm_head.weight = model.transformer.wte.weight
    return model


def gpt_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """GPT.forward's computation without its token check (int() of a meta tensor has no
    value): embeddings, dropout, the blocks, ln_f, the head, cross-entropy."""
    T = idx.size(1)  # (B, T) tokens
    tr = model.transformer
    x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(T, dtype=torch.int64, device=idx.device)))
    for block in tr.h:
        x = block(x)
    return NextTokenLoss()((model.lm_head(tr.ln_f(x)), None), targets)


def gpt_flops(model: nn.Module, case: GPTCase, device: str = "cpu") -> dict[str, int]:
    """FlopCounterMode by phase over gpt_loss + backward of `model` (any device), each block
    checkpointed for "full" and "full_early_stop" (no optimizer: its step counts 0)."""
    from torch_impl import accounting as tacc

    idx = torch.zeros(case.batch, case.seq_len, dtype=torch.int64, device=device)
    blocks = list(model.transformer.h) if case.recompute != "none" else []
    with tacc.checkpointed(blocks, early_stop=case.recompute != "full"), \
            tacc.StepMeter(model) as meter:
        loss = gpt_loss(model, idx, idx)
        meter.backward_begins()
        loss.backward()
    return meter.flops.as_dict()


def meta_flops(case: GPTCase) -> dict[str, int]:
    """gpt_flops on the meta device: a model of any size, counted without allocating it."""
    return gpt_flops(meta_gpt(config_of(case)), case, "meta")


def sdpa_flops(case: GPTCase, device: str = "cpu") -> dict[str, int]:
    """gpt_flops of the model with attention="sdpa" (dropout off), on `device`."""
    from dataclasses import replace

    from torch_impl import gpt as tgpt

    config = replace(config_of(case), attention="sdpa", dropout=0.0)
    model = meta_gpt(config) if device == "meta" else tgpt.GPT(
        config, generator=torch.Generator().manual_seed(0), device=device)
    return gpt_flops(model, case, device)


# ---------------------------------------------------------------- the reference
def reference_gpt_step(case: GPTCase, dtype: type = np.float32, seed: int = 0
                       ) -> dict[str, object]:
    """The reference GPT: its tape after the forward (held bytes, its own GEMM count) when
    float32/float64 without recompute, then backward and one optimizer step: the state."""
    from reference import gpt as rgpt
    from reference import optim

    model = rgpt.GPT(config_of(case), rng=np.random.default_rng(seed), dtype=dtype)
    cls, kw = OPTIMIZERS[case.optimizer]
    optimizer = getattr(optim, cls)(model.parameters(), **kw)
    idx, targets = tokens(case, seed)
    model.forward(idx, targets)
    out: dict[str, object] = {"held": None, "tape_forward": None}
    if case.precision == "fp32" and case.recompute == "none":
        loss = racc.tape_bytes([model.loss_fn])  # its own arrays: no model save among them
        out["held"] = {"model": model.held_bytes() - loss, "loss": loss, "other": None}
        out["tape_forward"] = ragpt.gpt_tape_flops(model)
    model.backward()
    optimizer.step()
    out["state"] = racc.state_bytes(model, optimizer)  # type: ignore[arg-type]
    return out


# ---------------------------------------------------------------- the sheet
def activation_rows(case: GPTCase, device: str = "cpu") -> list[Row]:
    """The exact rows: the model's saves (gpt_activation_bytes minus the loss), the loss's,
    fp16's GradScaler multiply."""
    shape = {k: getattr(case, k) for k in ("n_layer", "n_head", "seq_len", "vocab", "batch")}
    kw = {**shape, "d_model": case.d_model, "dropout": case.dropout, "bias": case.bias,
          "precision": case.precision, "device": device.split(":")[0]}
    held = ragpt.gpt_activation_bytes(**kw, recompute=case.recompute)  # type: ignore[arg-type]
    saved, _ = ragpt.gpt_saved(**{**kw, "n_layer": 1})  # type: ignore[arg-type]  # the loss's
    # saves do not depend on depth: one block, not every block (NOTE [ Depth is affine ])
    loss = racc.held_bytes(s for s in saved if s.layer == "")
    return [Row("memory", "activations: model", held["total"] - loss,
                f"gpt_activation_bytes(recompute={case.recompute!r}) - the loss"),
            Row("memory", "activations: loss", loss, "gpt_saved: the loss's entries"),
            Row("memory", "activations: GradScaler", 4 if case.precision == "fp16" else 0,
                "fp16: loss * scale saves the float32 scale")]


def reconcile_gpt(rows: list[Row], case: GPTCase, measured_torch: dict,
                  measured_ref: dict) -> None:
    """Fill each row's measurements and name each gap's term (UNEXPLAINED if none fits).
    The reference's forward FLOPs are its tape's own count; it has no GradScaler region."""
    for tree, m in (("torch", measured_torch), ("reference", measured_ref)):
        state, held, fl = m.get("state", {}), m.get("held"), m.get("flops")
        for r in rows:
            value: int | None
            if r.section == "flops":
                value = None if fl is None else fl.get(r.name, 0)
                if tree == "reference" and r.name == "forward":
                    value = m.get("tape_forward")
            elif r.name.startswith("activations"):
                key = {"activations: model": "model", "activations: loss": "loss",
                       "activations: GradScaler": "other"}.get(r.name)
                value = None if held is None or key is None else held[key]
            else:
                value = state.get(r.name, 0)
            r.measured[tree] = value
            if r.gap(tree):  # no term is expected: every quantity is modelled exactly
                r.terms[tree] = "UNEXPLAINED"


def gpt_sheet(case: GPTCase, device: str = "cpu") -> list[Row]:
    """predict_gpt's rows with the exact activation rows in place of the pending one (for
    this project's precisions; the formula's *_mixed keep Korthikanti's row only)."""
    from parity.drivers.accounting import predict_gpt

    rows = predict_gpt(case)
    at = next(i for i, r in enumerate(rows) if r.name == "activations: this block, exact")
    exact = activation_rows(case, device) if case.precision in racc.PROJECT_PRECISIONS else []
    return rows[:at] + exact + rows[at + 1:]


def measure_gpt(case: GPTCase, device: str = "cpu") -> tuple[list[Row], dict]:
    """The sheet reconciled with one step in each tree; returns (rows, torch's measurement)."""
    rows = gpt_sheet(case, device)
    theirs = torch_gpt_step(case, device)
    mine = reference_gpt_step(case)
    reconcile_gpt(rows, case, theirs, mine)
    return rows, theirs


# ---------------------------------------------------------------- committed measurements
DATA = Path(__file__).resolve().parents[2] / "docs" / "data" / "accounting_gpt.json"
_DEFAULT = GPTConfig()  # the project's default transformer, one step of 4 full sequences
RECONCILED = tuple(
    GPTCase(n_layer=_DEFAULT.n_layer, d_model=_DEFAULT.n_embd, n_head=_DEFAULT.n_head,
            seq_len=_DEFAULT.block_size, vocab=_DEFAULT.vocab_size, batch=4, **kw)
    for kw in ({"precision": "fp32", "optimizer": "adamw", "recompute": "none"},
               {"precision": "bf16", "optimizer": "adamw", "recompute": "full_early_stop",
                "dropout": 0.1},
               {"precision": "fp16", "optimizer": "adam", "recompute": "full"}))


def reconciliation(case: GPTCase) -> dict[str, object]:
    """One case's sheet measured in both trees, as JSON-ready data."""
    rows, _ = measure_gpt(case)
    return {"config": asdict(case), "n_params": case.n_params,
            "rows": [asdict(r) for r in rows]}


def main() -> None:
    """python -m parity.drivers.accounting_gpt: measure RECONCILED into docs/data (integers
    only: byte counts and FLOPs, deterministic; no timing)."""
    data = {"torch": torch.__version__.split("+")[0],
            "cases": [reconciliation(case) for case in RECONCILED]}
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
