"""The compact transformer's half of the prediction sheet (parity/drivers/profile.py holds the
MLP's and dispatches on the model): its accountant rows, held activations and FLOPs under a
per-block recompute schedule, its batch, and the block whose saves the sheet lists.

The transformer a profile runs is `train --model gpt`'s (reference/train_models.py: TRAIN_SHAPE,
the copy task). Its recomputation is a schedule over the n_layer blocks (none, sqrt,
uniform:K, optimal:S: recompute_plans.parse_schedule); the accountant (reference/
accounting_gpt.py) counts "none" and "every block checkpointed", which no schedule is (the
last block of a plan is never checkpointed), so the held bytes under a plan are walked here
from the accountant's own list of saves (gpt_saved), as _held_tensors does for the MLP:
a top-level Segment holds its first block's input, any other block every save of its own.
The recompute FLOPs likewise: recompute_runs (reference/flops.py) over the blocks, each
started block one block forward (transformer_forward_flops' blocks + attention over n_layer),
a block cut by torch's early stop less its mlp.c_proj GEMM when no dropout mask follows it
(NOTE [ Early stop in the block recompute ]). Selective recomputation (the attention core) is
not in the accountant: refused.
"""

from __future__ import annotations

from typing import Any

from common.gpt_config import TRAIN_SHAPE
from parity.drivers import accounting as acc
from reference import accounting as racc
from reference import accounting_gpt as ragpt
from reference import flops as rflops
from reference.recompute import Segment, parse_schedule

LISTED_BLOCK = "transformer.h.0"  # the block whose saved tensors the sheet lists
SUPPORTED_RECOMPUTE = "none, sqrt, uniform:K, optimal:S (schedules over the blocks)"


def check_recompute(spec: str) -> None:
    """ValueError unless `spec` is a block schedule the sheet can predict."""
    if "selective" in spec.split("+"):
        raise ValueError(f"--model gpt --recompute {spec}: selective recomputation (the "
                         "attention core) is not in the transformer's accountant; accepted: "
                         f"{SUPPORTED_RECOMPUTE}")
    try:
        parse_schedule(spec, TRAIN_SHAPE.n_layer)
    except ValueError as e:
        raise ValueError(f"--model gpt --recompute {spec}: {e}; accepted: "
                         f"{SUPPORTED_RECOMPUTE}") from None


def gpt_case(batch: int, precision: str, optimizer: str, dropout: float) -> acc.GPTCase:
    """The accountant's case of train --model gpt's transformer (one step of `batch` full
    sequences; `optimizer` in the formula's names)."""
    s = TRAIN_SHAPE
    return acc.GPTCase(n_layer=s.n_layer, d_model=s.n_embd, n_head=s.n_head,
                       seq_len=s.block_size, vocab=s.vocab_size, batch=batch, bias=s.bias,
                       tie_weights=s.tie_weights, dropout=dropout, precision=precision,
                       optimizer=optimizer)


def _saved(case: acc.GPTCase, device: str) -> tuple[list[racc.Saved], list[racc.Saved]]:
    return ragpt.gpt_saved(n_layer=case.n_layer, d_model=case.d_model, n_head=case.n_head,
                           seq_len=case.seq_len, vocab=case.vocab, batch=case.batch,
                           dropout=case.dropout, bias=case.bias, precision=case.precision,
                           device=device)


def held_tensors(case: acc.GPTCase, recompute: str, device: str) -> list[racc.Saved]:
    """The saves held between forward and backward under the block schedule `recompute`
    (module docstring); with "none" gpt_activation_bytes' total (checked)."""
    saved, inputs = _saved(case, device)
    held = [s for s in saved if not str(s.layer).startswith("transformer.h.")]
    for item in parse_schedule(recompute, case.n_layer).plan:
        if isinstance(item, Segment):
            held.append(inputs[item.start])
        else:
            held += [s for s in saved if str(s.layer).startswith(f"transformer.h.{item}.")]
    if recompute == "none":
        assert racc.held_bytes(held) == ragpt.gpt_activation_bytes(
            n_layer=case.n_layer, d_model=case.d_model, n_head=case.n_head,
            seq_len=case.seq_len, vocab=case.vocab, batch=case.batch, dropout=case.dropout,
            bias=case.bias, precision=case.precision, device=device)["total"]
    return held


def phase_flops(case: acc.GPTCase, recompute: str, early_stop: bool) -> dict[str, int]:
    """forward, backward (2 forward: no GEMM has the token ids as an operand), recompute
    under the block schedule (module docstring), optimizer 0, total."""
    fwd = rflops.transformer_forward_flops(n_layer=case.n_layer, d_model=case.d_model,
                                           n_head=case.n_head, seq_len=case.seq_len,
                                           vocab=case.vocab, batch=case.batch)
    block = (fwd["blocks"] + fwd["attention"]) // case.n_layer
    c_proj = 2 * case.batch * case.seq_len * 4 * case.d_model * case.d_model
    plan = parse_schedule(recompute, case.n_layer).plan
    started, cut = rflops.recompute_runs(plan, [True] * case.n_layer, early_stop)
    again = sum(started.values()) * block - (sum(cut.values()) * c_proj
                                              if case.dropout == 0 else 0)
    phases = {"forward": fwd["total"], "backward": 2 * fwd["total"], "recompute": again,
              "optimizer": 0}
    return {**phases, "total": sum(phases.values())}


def predict_rows(case: acc.GPTCase, recompute: str, device: str) -> list[acc.Row]:
    """The sheet's rows: training state (predict_gpt's), the exact held activations of the
    model and of the loss under the schedule, fp16's GradScaler save, FLOPs by phase."""
    state = [r for r in acc.predict_gpt(case) if r.section == "memory"
             and not r.name.startswith("activations")]
    held = held_tensors(case, recompute, device)
    loss = racc.held_bytes(s for s in held if s.layer == "")
    rows = [*state,
            acc.Row("memory", "activations: model", racc.held_bytes(held) - loss,
                    f"gpt_saved held under the block schedule {recompute!r} - the loss"),
            acc.Row("memory", "activations: loss", loss, "gpt_saved: the loss's entries"),
            acc.Row("memory", "activations: GradScaler", 4 if case.precision == "fp16" else 0,
                    "fp16: loss * scale saves the float32 scale")]
    fl = phase_flops(case, recompute, early_stop=True)
    rows += [acc.Row("flops", k, v, "transformer_forward_flops, recompute_runs over blocks")
             for k, v in fl.items() if k != "total"]
    return rows


def batch_bytes(batch: int) -> dict[str, int]:
    """The loop's batch: token ids and next tokens, (B, T) int64 each; the loader gathers
    just those two."""
    x = y = batch * TRAIN_SHAPE.block_size * 8
    return {"x": x, "y": y, "gathered": x + y}


def saved_batch(case: acc.GPTCase, recompute: str, device: str, x: int, y: int) -> int:
    """The part of the batch that autograd holds at the forward's end: wte saves the token
    ids, the loss the targets (a view of them)."""
    held = {s.tensor for s in held_tensors(case, recompute, device)}
    return x * ("idx" in held) + y * ("targets" in held)


def listed_saves(case: acc.GPTCase, device: str) -> list[dict[str, Any]]:
    """LISTED_BLOCK's saves without recomputation: name, tensor, shape, bytes."""
    saved, _ = _saved(case, device)
    return [{"name": s.name, "tensor": s.tensor, "shape": list(s.shape), "bytes": s.nbytes,
             "module": s.layer} for s in saved
            if str(s.layer).startswith(f"{LISTED_BLOCK}.")]


def n_param_tensors(case: acc.GPTCase) -> int:
    return len(rflops.gpt_param_shapes(case.n_layer, case.d_model, case.vocab, case.seq_len,
                                       case.d_ff, case.bias, case.tie_weights))
