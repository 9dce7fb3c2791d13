"""The probable bound of the transformer's compile claims (compile.gpt_eager,
compile.gpt_reference, compile.gpt_bf16 in parity/claims/compile.py): the per-operation
rounding budgets propagated through the whole GPT, forward and backward, by random probes.

NOTE [ Probable bounds by probes ]
The MLP's probable bound (NOTE [ Probable bounds ], parity/claims/compile_bounds.py)
propagates variances through every layer by hand. The transformer has more kinds of
operation (LayerNorm with statistics shared by a row, attention's two products and softmax,
the residual stream, embeddings), so the same model is propagated by the computer instead:

    model     each operation j of the compared run rounds differently on the two sides by
              d_j, independent, mean zero, |d_j| <= B_j (the per-operation budgets below);
              to first order every compared value o (logits, loss, a parameter gradient)
              differs by X_o = sum_j c_oj d_j, c_oj = d o / d v_j
    variance  Var X_o <= sum_j c_oj^2 B_j^2 = E[(sum_j c_oj r_j B_j)^2], r_j independent
              random signs (+-1): the variance of the run's linear response to a kick of
              +-B_j at every operation, forward and backward
    probes    that response is measured exactly: the model run in float64 (its own roundings
              1e-9 of the kicks) once plain and K times with fresh signs; each probe's
              difference from the plain run is one draw of sum_j c_oj r_j B_j (the kicks are
              eps-small, so second-order terms are eps^2), and the mean of K squares
              estimates sigma_o^2
    bound     S_o = LAMBDA sqrt(INFLATE sigma_o^2 estimate), LAMBDA = 6 as the MLP's
              (Hoeffding: P(|X_o| >= 6 sigma_o) <= 2 exp(-18) = 3e-8); INFLATE = 2 covers
              the estimate: the response is a sum of thousands of small terms, close to
              Gaussian, so K = 64 squares estimate sigma^2 within a chi-square of 64 degrees
              of freedom, below half the truth with probability about 5e-4 per value, and
              even then the bound stays above 5 sigma (P <= 7e-6)

Budgets B_j (probable form: a k-term sum rounds k times on each side, each error at most
u = eps/2 of a partial sum bounded by the sum of absolute terms, so the two sides differ by
at most sqrt((k + 1)/2) eps sum|terms| in standard deviation, as the MLP's products):

    Linear / matmul   y = x W^T + b:  sqrt((k + 1)/2) eps (|x||W|^T + |b|)
                      dx = g W: sqrt((m + 1)/2) eps |g||W|;  dW = g^T x: sqrt((N + 1)/2) eps
                      |g|^T|x|;  db = sum g: sqrt((N + 1)/2) eps sum|g| (N rows, m outputs)
    LayerNorm         the row's mean sqrt((C + 1)/2) eps mean|x| and rstd's relative
                      sqrt((C + 3)/8 + 2) eps (the variance's C-term sum halved by the square
                      root, the root and the division), one kick per ROW, carried by the
                      run into xhat and from there into y, dx and dw; four roundings per
                      element (subtraction, products, add: sqrt 2 eps (|w xhat| + |y|));
                      backward: its two C-term means (sqrt((C + 1)/2) eps of mean|g w| and of
                      |xhat| mean|g w xhat|) and five elementwise roundings (sqrt(5/2) eps of
                      the terms' sum) times rstd; dw, db: row sums as db above
    attention core    s = q k^T c: the product's budget and one rounding of the scale
                      (eps/sqrt 2 |s|); softmax: exp within 4 ulps, s - max s relative
                      |s - max s| u, the T-term normalizer and the division: p eps
                      sqrt(16 + |s - max s|^2/2 + (T + 1)/2 + 1/2); its backward p (dp -
                      <p, dp>): the T-term sum sqrt((T + 1)/2) eps p <p|dp|> and 3 roundings
                      of p (|dp| + |<p, dp>|); y = p v and its backward as products
    GELU (tanh)       nn.gelu_tanh's budgets: 3 eps |x| forward, 8 eps |g|(1 + |x|(1 + x^2))
                      backward (parity/claims/nn.py)
    residual add      one rounding of the sum per side: eps/sqrt 2 |x + y|
    embeddings        the lookups and their add are the same operations on equal operands:
                      equal; the gradient's scatter-add of n_v rows into token v:
                      sqrt((n_v + 1)/2) eps sum|g|
    cross-entropy     each row within nn.cross_entropy's eps (A + nll_i), A = V + 5 + 5 ln V,
                      the rows independent; the mean's N-term sum as a product's; the
                      gradient within ce_scales' budget per element

These are the budgets of two different implementations of each operation, so one bound
serves compiled vs eager (Inductor re-derives LayerNorm, softmax, GELU and the cross-entropy
as its own loops, fuses the residual adds and bias adds into them, and calls the same extern
products on operands that already differ) and compiled vs the NumPy reference. Under
autocast (`lp`) every value autocast rounds to bfloat16 (each product's output, the scale,
softmax, GELU, and the gradients of those values: nothing of LayerNorm, the residual stream
or the loss, which stay float32) gets one more kick of eps_lp |v|: round-to-nearest is
monotone, so two inputs that differ round at most |a - b| + 1 ulp apart (compile.bf16's
argument), and Inductor may keep a fused intermediate in float32 where eager rounds it,
another ulp at most. The approximation, as the MLP's: a kick is independent per element
where one side's rounding is shared by a row (softmax's normalizer, a mean); the
LayerNorm statistics, the largest of those, are kicked per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from common.gpt_config import GPTConfig
from parity.claims.compile_bounds import EPS32, LAMBDA
from parity.claims.compile_gpt_ops import (
    EPS_BF16,
    Probe,
    Results,
    add,
    cross_entropy,
    embedding,
    gelu,
    layer_norm,
    linear,
    matmul,
    scale,
    softmax,
)

PROBES = 64  # K: NOTE [ Probable bounds by probes ]
INFLATE = 2.0  # the variance estimate's allowance (chi-square, 64 degrees of freedom)

__all__ = ["EPS32", "EPS_BF16", "INFLATE", "LAMBDA", "PROBES", "ProbeBound", "Results",
           "gpt_run", "probe_bounds"]

# ---------------------------------------------------------------- the model

def gpt_run(params: dict[str, torch.Tensor], config: GPTConfig, idx: torch.Tensor,
            targets: torch.Tensor, probe: Probe | None) -> Results:
    """The GPT's forward, loss and backward in float64 from `params` (float64 leaves), every
    operation kicked by `probe`: {"output": logits, "loss": loss, name: gradient}."""
    for p in params.values():
        p.grad = None
    B, T = idx.shape
    C, nh = config.n_embd, config.n_head
    hs = C // nh
    visible = torch.tril(torch.ones(T, T, dtype=torch.bool))
    pos = torch.arange(T)
    x = (embedding(probe, params["transformer.wte.weight"], idx)
         + embedding(probe, params["transformer.wpe.weight"], pos))  # equal on both sides

    def par(name: str) -> torch.Tensor | None:
        return params.get(name)

    for i in range(config.n_layer):
        pre = f"transformer.h.{i}."
        h = layer_norm(probe, x, params[pre + "ln_1.weight"], params[pre + "ln_1.bias"])
        qkv = linear(probe, h, params[pre + "attn.c_attn.weight"], par(pre + "attn.c_attn.bias"))
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        s = scale(probe, matmul(probe, q, k.transpose(-2, -1)), 1.0 / math.sqrt(hs))
        y = matmul(probe, softmax(probe, s, visible), v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = add(probe, x, linear(probe, y, params[pre + "attn.c_proj.weight"],
                                 par(pre + "attn.c_proj.bias")))
        h = layer_norm(probe, x, params[pre + "ln_2.weight"], params[pre + "ln_2.bias"])
        h = gelu(probe, linear(probe, h, params[pre + "mlp.c_fc.weight"],
                               par(pre + "mlp.c_fc.bias")))
        x = add(probe, x, linear(probe, h, params[pre + "mlp.c_proj.weight"],
                                 par(pre + "mlp.c_proj.bias")))
    h = layer_norm(probe, x, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"])
    logits = linear(probe, h, params["lm_head.weight"], par("lm_head.bias"))
    loss = cross_entropy(probe, logits.view(B * T, -1), targets.view(B * T))
    loss.backward()
    out = {"output": logits.detach().numpy(), "loss": loss.detach().numpy()}
    out.update({k: p.grad.numpy() for k, p in params.items()})
    return out


@dataclass(frozen=True)
class ProbeBound:
    """S per compared entry (units of `eps`), and the plain float64 run's values."""

    scale: Results
    plain: Results
    eps: float


def probe_bounds(state: dict[str, np.ndarray], config: GPTConfig, idx: np.ndarray,
                 targets: np.ndarray, *, lp: str = "fp32", probes: int = PROBES,
                 seed: int = 0) -> ProbeBound:
    """LAMBDA sqrt(INFLATE x the estimated variance) of every compared value, in float32 eps
    (lp "fp32") or bfloat16 eps for the logits (lp "bf16": the logits are bfloat16 there),
    NOTE [ Probable bounds by probes ]. `state`: the compared weights (float32 arrays by
    parameter name, the untied model's), dropout off, explicit attention."""
    if config.dropout or config.attention != "explicit" or config.tie_weights:
        raise ValueError("probe_bounds: the explicit attention path, dropout 0 and untied "
                         f"weights only, got {config}")
    if lp not in ("fp32", "bf16"):
        raise ValueError(f"probe_bounds: lp must be 'fp32' or 'bf16', got {lp!r}")
    eps_lp = EPS_BF16 if lp == "bf16" else 0.0
    params = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)).requires_grad_()
              for k, v in state.items()}
    ti, tt = torch.from_numpy(idx), torch.from_numpy(targets)
    with torch.random.fork_rng(devices=[]):
        plain = gpt_run(params, config, ti, tt, None)
        squares = {k: np.zeros_like(v) for k, v in plain.items()}
        for j in range(probes):
            kicked = gpt_run(params, config, ti, tt, Probe(seed * 100003 + j, eps_lp))
            for k, v in kicked.items():
                squares[k] += (v - plain[k]) ** 2
    scale = {k: LAMBDA * np.sqrt(INFLATE * sq / probes) / EPS32 for k, sq in squares.items()}
    if lp == "bf16":
        scale["output"] = scale["output"] * EPS32 / EPS_BF16
    return ProbeBound(scale, plain, EPS32)
