"""Quick checks of the gpt claims for `python -m parity report` (drivers: parity/drivers/gpt.py)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import torch

from parity.checks.nn import _Worst
from parity.drivers import gpt as dg
from parity.drivers import gpt_bounds as gb
from parity.drivers import gpt_pairs as gp
from parity.report import Observation, check
from reference import gpt as rgpt

_CONFIG = dg.GPTConfig()  # the tiny default: 2 layers, 2 heads, width 32, block 16
_DROPOUT = dataclasses.replace(_CONFIG, dropout=0.1)
_CASES = [(cfg, dtype) for cfg in (_CONFIG, _DROPOUT) for dtype in (np.float32, np.float64)]
_NOTE = "default config, dropout 0 and 0.1, float32 and float64, batch 4 x 16 tokens"


@cache
def _pairs(kind: str) -> tuple[tuple[str, str, np.ndarray, np.ndarray, np.ndarray | None], ...]:
    out: list = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # gpt.layer_norm.bias_grad is claimed on one thread
    try:
        for cfg, dtype in _CASES:
            if kind == "layerwise":
                out += gp.layerwise_pairs(cfg, dtype, 4, 16, 7)[0]
            elif kind == "grads":
                out += gp.grad_pairs(cfg, dtype, 4, 16, 7)[0]
            else:
                out += gp.carried_pairs(cfg, dtype, 4, 16, 7)
    finally:
        torch.set_num_threads(threads)
    return tuple(out)


def _observe(claim_id: str, kind: str) -> Observation:
    worst = _Worst(claim_id)
    for cid, _, a, b, s in _pairs(kind):
        if cid == claim_id:
            worst.add(a, b, s)
    return worst.observation(_NOTE)


for _cid in ("gpt.embedding", "gpt.layer_norm.forward", "gpt.layer_norm.backward",
             "gpt.layer_norm.bias_grad", "gpt.attention.forward", "gpt.attention.backward"):
    check(_cid)(lambda cid=_cid: _observe(cid, "layerwise"))
for _cid in ("gpt.logits", "gpt.loss"):
    check(_cid)(lambda cid=_cid: _observe(cid, "carried"))
check("gpt.grads")(lambda: _observe("gpt.grads", "grads"))


@check("gpt.saved_tensors")
def _() -> Observation:
    mismatches, n = 0, 0
    for cfg, dtype in _CASES:
        idx, targets = dg.tokens(cfg, 4, 16, 7)
        ref, ref_held, tch, tch_held = dg.saved_both(cfg, dtype, idx, targets)
        mismatches += sum(((ref - tch) + (tch - ref)).values()) + (ref_held != tch_held)
        n += sum(ref.values()) + 1
    return Observation(float(mismatches), n, _NOTE + "; entries and held bytes")


@check("gpt.state_dict_roundtrip")
def _() -> Observation:
    worst = _Worst("gpt.state_dict_roundtrip")
    for tie in (False, True):
        ref = rgpt.GPT(dataclasses.replace(_CONFIG, tie_weights=tie), rng=np.random.default_rng(0))
        back, state = dg.state_dict_roundtrip(ref), ref.state_dict()
        for key, value in state.items():
            worst.add(back[key], value)
    return worst.observation("default config, untied and tied")


@check("gpt.boundary")
def _() -> Observation:
    cases = dg.bad_inputs(_CONFIG)
    differ = sum(ref[0] is None or ref[0] is not tch[0] for ref, tch in (
        dg.boundary_errors(_CONFIG, idx, tg) for idx, tg in cases.values()))
    return Observation(float(differ), len(cases), ", ".join(sorted(cases)))


@check("gpt.sdpa")
def _() -> Observation:
    worst = _Worst("gpt.sdpa")
    for dtype in (np.float32, np.float64):
        _, twin = dg.make_pair(_CONFIG, dtype, 7)
        idx, targets = dg.tokens(_CONFIG, 4, 16, 7)
        for path, (ins, out, _, _) in dg.run_torch(twin, idx, targets, layerwise=True
                                                   ).layers.items():
            if path.endswith(".core"):
                fused = torch.nn.functional.scaled_dot_product_attention(
                    *(torch.from_numpy(a) for a in ins), is_causal=True).numpy()
                worst.add(fused, out, gb.attention_forward_scale(*ins, None)[0])
    return worst.observation("default config, float32 and float64, no dropout")



@check("gpt.copy_task")
def _() -> Observation:
    from reference import data as rdata
    from torch_impl import data as tdata

    worst = _Worst("gpt.copy_task")
    for seed, prefix, vocab in ((0, 8, 12), (1, 5, 30), (2**32 - 1, 1, 3)):
        a = rdata.make_copy_task(seed, 200, prefix=prefix, vocab_size=vocab)
        b = tdata.make_copy_task(seed, 200, prefix=prefix, vocab_size=vocab)
        worst.add(a.inputs, b.inputs.numpy())
        worst.add(a.labels, b.labels.numpy())
    return worst.observation("200 samples, three (seed, prefix, vocab) settings")


@check("gpt.flops")
def _() -> Observation:
    listed = 3 * sum(2 * b * m * n * k for _, _, b, m, n, k in rgpt.matmuls(_CONFIG, 4, 16))
    measured = dg.torch_flops(_CONFIG, 4, 16, 7)
    return Observation(float(listed != measured), 1, f"listed {listed:,}, counted {measured:,}")


@check("gpt.autocast_saved_tensors")
def _() -> Observation:
    from parity.drivers import gpt_amp as ga

    mismatches = n = 0
    for cfg in (_CONFIG, _DROPOUT):
        for fmt in ga.FMTS:
            idx, targets = dg.tokens(cfg, 4, 16, 3)
            ref, ref_held, theirs, torch_held = ga.saved_both(cfg, fmt, idx, targets)
            mismatches += sum(((ref - theirs) + (theirs - ref)).values())
            mismatches += int(ref_held != torch_held)
            n += sum(ref.values()) + 1
    return Observation(float(mismatches), n, "default config, dropout 0 and 0.1, bf16 and "
                       "fp16 CPU autocast, batch 4 x 16 tokens; entries and held bytes")


def _autocast_layers(fmt: str) -> Observation:
    from parity.compare import measure
    from parity.drivers import gpt_amp as ga
    from parity.drivers.amp import SUFFIX, toward
    from parity.tolerances import claim

    c = claim(f"gpt.autocast_layers_{SUFFIX[fmt]}")
    worst, n, exact = 0.0, 0, 0
    for cfg in (_CONFIG, _DROPOUT):
        for claim_id, _, a, b, k in ga.layer_pairs(cfg, fmt, 4, 16, 7)[0]:
            if claim_id == c.id:
                worst = max(worst, measure(c, a, toward(b, a, k, fmt)))
                n, exact = n + a.size, exact + int((k == 0).sum())
    return Observation(worst, n, f"ulps beyond k; k = 0 for {exact / n:.1%}; default config, "
                       "dropout 0 and 0.1, batch 4 x 16")


check("gpt.autocast_layers_bf16")(lambda: _autocast_layers("bfloat16"))
check("gpt.autocast_layers_fp16")(lambda: _autocast_layers("float16"))


@check("gpt.autocast_free")
def _() -> Observation:
    from parity.drivers import gpt_free as gf

    wrong = n = 0
    for cfg in (_CONFIG, _DROPOUT):
        for fmt in ("bfloat16", "float16"):
            run = gf.free_running(cfg, fmt, 4, 16, 7)
            wrong += int(bool(run.first) and not (run.first_fed_equal and run.first_is_float32))
            n += 1
    return Observation(float(wrong), n, "runs whose first difference is not born in a float32 "
                       "op; default config, dropout 0 and 0.1, bf16 and fp16, batch 4 x 16")


def _core_autocast(fmt: str) -> Observation:
    from parity.compare import measure
    from parity.drivers import gpt_core_amp as gc
    from parity.drivers.amp import toward
    from parity.tolerances import claim

    worst, n, differ = 0.0, 0, 0
    for cfg in (_CONFIG, _DROPOUT):
        for recompute in (False, True):
            for cid, _, a, b, k in gc.core_pairs(cfg, fmt, 4, 16, 7, recompute)[0]:
                worst = max(worst, measure(claim(cid), a, toward(b, a, k, fmt)))
                n, differ = n + a.size, differ + int((a != b).sum())
    return Observation(worst, n, f"ulps beyond k; {differ} elements differ within k; default "
                       "config, dropout 0 and 0.1, recomputed core or not, batch 4 x 16")


check("gpt.attention_core_autocast_bf16")(lambda: _core_autocast("bfloat16"))
check("gpt.attention_core_autocast_fp16")(lambda: _core_autocast("float16"))


@check("gpt.autocast_free_residual")
def _() -> Observation:
    from parity.drivers import gpt_free as gf

    worst = _Worst("gpt.autocast_free_residual")
    for cfg in (_CONFIG, _DROPOUT):
        for fmt in ("bfloat16", "float16"):
            for _, _, a, b, s in gf.free_running(cfg, fmt, 4, 16, 7).residual:
                worst.add(a, b, s)
    return worst.observation("default config, dropout 0 and 0.1, bf16 and fp16, batch 4 x 16")
