"""The whole transformer under autocast, free-running (claims gpt.autocast_free_*): each tree
runs its own forward from the tokens to the loss and its own backward to every parameter
gradient, on the same weights, torch's dropout masks replayed into the reference; nothing of
one run feeds the other (parity/drivers/gpt_amp.py instead feeds each torch layer the
reference's own operands).

NOTE [ Where a free-running autocast run diverges ]
Every lp op of the run (each Linear, the GELU, the attention core) is bit-identical to
torch's whenever its operands are: fed equal bits it gives equal bits, forward and backward.
The runs still part, because the float32 ops in between are two different algorithms:
LayerNorm's mean and variance (NumPy's two-pass sums against torch's Welford-style moments,
gpt.layer_norm.forward: an ulp or so of float32), its backward's row sums, and the
cross-entropy's exp, log and reductions (gpt.loss). A float32 difference of an ulp survives
the cast to bf16/fp16 only where the value sits next to a rounding boundary, so most lp
values stay equal and a few differ by one lp ulp; those then spread through the following
matmuls, and an lp op fed equal operands later in the run is not always bit-identical either
(a Linear's float32 accumulation in another order lands on the other side of a rounding
boundary: gpt.autocast_layers_* allow k ulps, rarely needed; the attention core's softmax
rounds exp differently: gpt.attention_core_autocast_*). So the claim (gpt.autocast_free) is
where the difference is BORN: the embeddings and everything upstream of the first
difference are bit-identical, and the first op output that differs is a float32 op's fed
bit-identical inputs. The end differences (loss, logits, gradients) are measured and shown in
docs/gpt.md, not bounded (no end-to-end lp bound is derived). What joins the ops, the residual
stream, is held like gpt.logits holds it (gpt.autocast_free_residual): each LayerNorm's input
within the previous one's and the branch output's measured differences, plus one lp rounding
of the dropout product and one float32 rounding of the add; a residual stream kept in lp, or
a cast where none belongs, shows there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np
import torch

from parity.drivers import gpt as dg
from parity.drivers import gpt_pairs as gp
from parity.drivers.amp import f32, float32_accumulation
from reference import amp as ramp
from reference import nn as rnn
from reference.layers import LayerNorm
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

_FLOAT32_OPS = (LayerNorm,)  # float32 under CPU autocast, another algorithm: not bits


@dataclass
class FreeRun:
    """One free-running pair of runs: the end results, and each lp op's check."""

    ends: list[tuple[str, np.ndarray, np.ndarray]]  # (name, reference, torch)
    checked: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    skipped: int = 0  # lp ops whose operands already differed (not claimed)
    first: str = ""  # the first op, in forward order, whose output differs
    first_fed_equal: bool = False  # and whether its own inputs were bit-identical
    first_is_float32: bool = False  # and whether it is a float32 op (a LayerNorm)
    residual: list = field(default_factory=list)  # gpt.autocast_free_residual's pairs


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(f32(x), f32(y)) for x, y in zip(a, b, strict=True))


def free_running(config: dg.GPTConfig, fmt: str, batch: int, seq_len: int, seed: int,
                 device: str = "cpu") -> FreeRun:
    """Both trees from the same tokens and weights (untied) under `fmt` autocast, each feeding
    itself; every lp op whose operands are bit-identical is checked for bit-identical
    results: forward outputs of Linear, GELU and attention core, and each Linear's parameter
    gradients where its input and incoming gradient agree."""
    config = replace(config, tie_weights=False)
    ref, twin = dg.make_pair(config, np.float32, seed % 1000, device, affine=True)
    twin.train(ref.training)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    with float32_accumulation(device):
        run = dg.run_torch(twin, idx, targets, device, layerwise=True,
                           autocast=TORCH_DTYPES[fmt])
    kind = torch.device(device).type
    seen, gouts = gp.record_ref(ref, idx, targets, run.keeps, backward=True,
                                autocast=(fmt, kind))
    logits, loss, grads = dg.run_ref_autocast(ref, idx, targets, run.keeps, fmt, kind)
    out = FreeRun([("loss", f32(np.asarray(loss)), run.loss), ("logits", f32(logits), run.logits)]
                  + [(n, grads[n], run.grads[n]) for n in sorted(grads)])
    lp = ml_dtypes.finfo(ramp.LP_DTYPES[fmt])
    out.residual = gp.residual_pairs(config, np.float32, seen, run, "gpt.autocast_free_residual",
                                     (float(lp.eps), float(lp.smallest_subnormal)))
    modules = dict(ref.named_modules())
    for path, (ins, y) in seen.items():  # forward order
        t_ins, t_y, _, t_g = run.layers[path]
        m = modules[path]
        if not out.first and not np.array_equal(f32(y), t_y):
            out.first, out.first_fed_equal = path, _same(ins, t_ins)
            out.first_is_float32 = isinstance(m, _FLOAT32_OPS)
        if isinstance(m, _FLOAT32_OPS):
            continue
        if not _same(ins, t_ins):
            out.skipped += 1
            continue
        out.checked.append((f"{path} y", f32(y), t_y))
        if isinstance(m, rnn.Linear) and path in gouts:
            if not np.array_equal(f32(gouts[path]), f32(t_g)):
                out.skipped += 1
                continue
            out.checked += [(f"{path}.{k}.grad", grads[f"{path}.{k}"], run.grads[f"{path}.{k}"])
                            for k in m._params]
    return out


def end_differences(batch: int = 4, seed: int = 7) -> list[dict]:
    """For docs/gpt.md (through docs/data/gpt_autocast_free.json): the default config,
    dropout 0, torch on one thread, bf16 and fp16: where the difference is born, the loss's
    difference in float32 ulps, the logits differing (count, max lp ulps), the parameter
    gradients differing (tensors, elements) and the worst max |a - b| / max |b|."""
    from parity.drivers.lp_ordinal import ordinal

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the suite's setting: torch's CPU sums depend on the threads
    try:
        runs = [(fmt, free_running(dg.GPTConfig(), fmt, batch, 16, seed))
                for fmt in ("bfloat16", "float16")]
    finally:
        torch.set_num_threads(threads)
    rows = []
    for fmt, run in runs:
        (_, la, lb), (_, za, zb), *grads = run.ends
        dz = np.abs(ordinal(za, fmt) - ordinal(zb, fmt))
        differ = [int((a != b).sum()) for _, a, b in grads]
        rows.append({
            "fmt": fmt, "first": run.first,
            "loss_ulps": int(ordinal(la.reshape(1), "float32")[0]
                             - ordinal(lb.reshape(1), "float32")[0]),
            "logits_differ": int((dz > 0).sum()), "logits": int(dz.size),
            "logits_max_ulps": int(dz.max()),
            "grad_tensors_differ": sum(d > 0 for d in differ), "grad_tensors": len(grads),
            "grad_elements_differ": sum(differ),
            "grad_elements": sum(int(a.size) for _, a, _ in grads),
            "grad_worst_rel": max(float(np.abs(a - b).max() / np.abs(b).max())
                                  for _, a, b in grads)})
    return rows
