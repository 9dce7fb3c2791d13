"""The probable bound of the transformer's compile claims (compile.gpt_eager,
compile.gpt_reference, compile.gpt_bf16 in parity/claims/compile.py): the per-operation
rounding budgets propagated through the whole GPT, forward and backward, by random probes.

NOTE [ Probable bounds by probes ]
The MLP's probable bound (NOTE [ Probable bounds ], parity/drivers/compile_bounds.py)
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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from parity.drivers.compile_bounds import EPS32, LAMBDA
from parity.drivers.nn import ce_scales
from reference.gpt_config import GPTConfig
from reference.layers import LN_EPS

PROBES = 64  # K: NOTE [ Probable bounds by probes ]
INFLATE = 2.0  # the variance estimate's allowance (chi-square, 64 degrees of freedom)
EPS_BF16 = 2.0 ** -7

Budget = Callable[..., list[torch.Tensor | None]]
Results = dict[str, np.ndarray]


class Probe:
    """Random signs for the kicks of one probe run (None: the plain run, no kicks)."""

    def __init__(self, seed: int, lp: float) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.lp = lp  # eps of autocast's dtype, 0.0 for float32

    def kick(self, magnitude: torch.Tensor) -> torch.Tensor:
        bits = torch.randint(0, 2, magnitude.shape, generator=self.generator)
        return (2.0 * bits.double() - 1.0) * magnitude


def _kick(probe: Probe | None, magnitude: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(magnitude) if probe is None else probe.kick(magnitude.detach())


class _Op(torch.autograd.Function):
    """y = fn(*inputs) + a forward kick; each input's gradient + a backward kick, the
    magnitudes from the budget functions (float64 throughout)."""

    @staticmethod
    def forward(ctx, fn, forward_budget, backward_budget, probe, *inputs):
        with torch.enable_grad():
            xs = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
            y = fn(*xs)
        ctx.fn_state = (xs, y, backward_budget, probe)
        return y.detach() + _kick(probe, forward_budget(*[x.detach() for x in xs],
                                                          y.detach()))

    @staticmethod
    def backward(ctx, g):
        xs, y, backward_budget, probe = ctx.fn_state
        wanted = [x for x in xs if x.requires_grad]
        grads = iter(torch.autograd.grad(y, wanted, g, allow_unused=True))
        budgets = backward_budget(*[x.detach() for x in xs], y.detach(), g)
        out = []
        for x, budget in zip(xs, budgets, strict=True):
            grad = next(grads) if x.requires_grad else None
            if grad is not None and budget is not None:
                grad = grad + _kick(probe, budget)
            out.append(grad)
        return (None, None, None, None, *out)


def _op(probe: Probe | None, fn: Callable[..., torch.Tensor], forward: Callable[..., torch.Tensor],
        backward: Budget, *inputs: torch.Tensor) -> torch.Tensor:
    return _Op.apply(fn, forward, backward, probe, *inputs)


def _sq(k: int) -> float:
    return math.sqrt((k + 1) / 2)


def _lp(probe: Probe | None, v: torch.Tensor) -> torch.Tensor:
    """autocast's rounding of v: one more kick of eps_lp |v| (nothing in float32)."""
    return 0.0 * v if probe is None or not probe.lp else probe.lp * v.abs()


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


# ---------------------------------------------------------------- the operations

def linear(probe: Probe | None, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
           ) -> torch.Tensor:
    eps = EPS32

    def fn(x: torch.Tensor, w: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w, b[0] if b else None)

    def forward(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        *b, y = rest
        mag = x.abs() @ w.abs().T + (b[0].abs() if b else 0.0)
        return eps * _sq(w.shape[1]) * mag + _lp(probe, y)

    def backward(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> list:
        *b, _, g = rest
        dx = g @ w
        n = _rows(x).shape[0]
        gx = _rows(g).abs().T @ _rows(x).abs()
        out = [eps * _sq(w.shape[0]) * g.abs() @ w.abs() + _lp(probe, dx),
               eps * _sq(n) * gx + _lp(probe, _rows(g).T @ _rows(x))]
        if b:
            out.append(eps * _sq(n) * _rows(g).abs().sum(0) + _lp(probe, _rows(g).sum(0)))
        return out

    return _op(probe, fn, forward, backward, x, w, *(() if b is None else (b,)))


def matmul(probe: Probe | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, batched (the attention core's two products)."""
    eps = EPS32

    def forward(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return eps * _sq(a.shape[-1]) * (a.abs() @ b.abs()) + _lp(probe, y)

    def backward(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> list:
        da, db = g @ b.transpose(-1, -2), a.transpose(-1, -2) @ g
        return [eps * _sq(b.shape[-1]) * (g.abs() @ b.abs().transpose(-1, -2)) + _lp(probe, da),
                eps * _sq(a.shape[-2]) * (a.abs().transpose(-1, -2) @ g.abs()) + _lp(probe, db)]

    return _op(probe, torch.matmul, forward, backward, a, b)


def scale(probe: Probe | None, s: torch.Tensor, c: float) -> torch.Tensor:
    """s * c: one rounding of each differing value (and of its gradient)."""
    def forward(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return EPS32 / math.sqrt(2) * y.abs() + _lp(probe, y)

    def backward(s: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> list:
        return [EPS32 / math.sqrt(2) * c * g.abs() + _lp(probe, c * g)]

    return _op(probe, lambda s: s * c, forward, backward, s)


def softmax(probe: Probe | None, s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension of s with the masked entries -inf (exactly 0 in p)."""
    eps = EPS32

    def fn(s: torch.Tensor) -> torch.Tensor:
        return F.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)

    def forward(s: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        T = visible.sum(-1, keepdim=True).double()  # terms of each row's normalizer
        shifted = torch.where(visible, s - s.masked_fill(~visible, -math.inf).amax(
            -1, keepdim=True), 0.0)
        rel = torch.sqrt(16 + shifted ** 2 / 2 + (T + 1) / 2 + 0.5)
        return eps * p * rel + _lp(probe, p)

    def backward(s: torch.Tensor, p: torch.Tensor, g: torch.Tensor) -> list:
        T = visible.sum(-1, keepdim=True).double()
        sigma = (p * g).sum(-1, keepdim=True)
        own = torch.sqrt(((T + 1) / 2) * (p * g.abs()).sum(-1, keepdim=True) ** 2
                         + 3 * (g.abs() + sigma.abs()) ** 2)
        ds = p * (g - sigma)
        return [torch.where(visible, eps * p * own + _lp(probe, ds), 0.0)]

    return _op(probe, fn, forward, backward, s)


def gelu(probe: Probe | None, x: torch.Tensor) -> torch.Tensor:
    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 3 * EPS32 * x.abs() + _lp(probe, y)

    def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> list:
        ax = x.abs()
        with torch.enable_grad():
            x = x.clone().requires_grad_()
            dx = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, g)[0]
        return [8 * EPS32 * g.abs() * (1 + ax * (1 + ax * ax)) + _lp(probe, dx)]

    return _op(probe, lambda x: F.gelu(x, approximate="tanh"), forward, backward, x)


def add(probe: Probe | None, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The residual add (float32 under autocast: no lp kick)."""
    def forward(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return EPS32 / math.sqrt(2) * z.abs()

    return _op(probe, torch.add, forward, lambda x, y, z, g: [None, None], x, y)


def layer_norm(probe: Probe | None, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
               ) -> torch.Tensor:
    """LayerNorm over the last dimension, its row statistics kicked once per row."""
    eps, C = EPS32, x.shape[-1]
    m = x.detach().abs().mean(-1, keepdim=True)
    kick_mean = _kick(probe, _sq(C) * eps * m)
    kick_rstd = _kick(probe, math.sqrt((C + 3) / 8 + 2) * eps * torch.ones_like(m))

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True) + kick_mean
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        rstd = (var + LN_EPS) ** -0.5 * (1 + kick_rstd)
        return (x - mean) * rstd * w + b

    def xhat_rstd(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = x - x.mean(-1, keepdim=True)
        rstd = ((d * d).mean(-1, keepdim=True) + LN_EPS) ** -0.5
        return d * rstd, rstd

    def forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor
                ) -> torch.Tensor:
        xhat, _ = xhat_rstd(x)
        return math.sqrt(2) * eps * ((w * xhat).abs() + y.abs())

    def backward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                 g: torch.Tensor) -> list:
        xhat, rstd = xhat_rstd(x)
        gw = g * w
        terms = gw.abs() + gw.mean(-1, keepdim=True).abs() + (xhat * (gw * xhat).mean(
            -1, keepdim=True)).abs()
        means = _sq(C) * torch.sqrt(gw.abs().mean(-1, keepdim=True) ** 2
                                    + (xhat.abs() * (gw * xhat).abs().mean(-1, keepdim=True))
                                    ** 2)
        dx = eps * rstd * torch.sqrt(means ** 2 + 2.5 * terms ** 2)
        n = _rows(x).shape[0]
        dw = eps * _sq(n) * (_rows(g) * _rows(xhat)).abs().sum(0)
        db = eps * _sq(n) * _rows(g).abs().sum(0)
        return [dx, dw, db]

    return _op(probe, fn, forward, backward, x, w, b)


def embedding(probe: Probe | None, weight: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """weight[idx]: exact; its gradient's scatter-add rounds per row of the table."""
    def backward(weight: torch.Tensor, idx: torch.Tensor, y: torch.Tensor, g: torch.Tensor
                 ) -> list:
        flat = idx.reshape(-1)
        total = torch.zeros_like(weight).index_add_(0, flat, _rows(g).abs())
        count = torch.zeros(weight.shape[0], dtype=torch.float64).index_add_(
            0, flat, torch.ones(flat.numel(), dtype=torch.float64))
        return [EPS32 * torch.sqrt((count[:, None] + 1) / 2) * total, None]

    return _op(probe, lambda w, i: w[i], lambda w, i, y: 0.0 * y, backward, weight, idx)


def cross_entropy(probe: Probe | None, logits: torch.Tensor, targets: torch.Tensor
                  ) -> torch.Tensor:
    """Mean cross-entropy of (N, V) logits; the nn.cross_entropy budgets as kicks."""
    def grad_scale(z: torch.Tensor) -> torch.Tensor:
        z32 = z.float().numpy()
        t = targets.numpy()
        return torch.from_numpy(ce_scales("mean", z32, t, np.float32(1.0), _ce_grad(z32, t))[1])

    def forward(z: torch.Tensor, t: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """Each row's log-softmax within nn.cross_entropy's eps (A + nll_i), independent
        across rows; the N-term mean sqrt((N + 1)/2) eps sum nll / N, the division u |l|
        per side (the probable form of ce_scales' worst-case (N - 1) sum)."""
        n, v = z.shape
        logp = torch.log_softmax(z, -1)
        nll = -logp.gather(1, t.view(-1, 1))[:, 0]
        a = v + 5 + 5 * math.log(v)
        own = (torch.sqrt(((a + nll) ** 2).sum()) + _sq(n) * nll.sum()) / n + nll.mean()
        return EPS32 * own

    def backward(z: torch.Tensor, t: torch.Tensor, loss: torch.Tensor, g: torch.Tensor
                 ) -> list:
        return [EPS32 * g.abs() * grad_scale(z), None]

    return _op(probe, F.cross_entropy, forward, backward, logits, targets)


def _ce_grad(z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(softmax(z) - onehot) / N in float64: the reference's input gradient, for ce_scales."""
    z64 = z.astype(np.float64)
    p = np.exp(z64 - z64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(len(t)), t] -= 1
    return p / len(t)


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
