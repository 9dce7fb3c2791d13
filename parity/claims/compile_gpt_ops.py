"""The operations of the transformer's probe model (parity/claims/compile_gpt_bounds.py):
each runs in float64 and kicks its output, and each of its inputs' gradients, by a random
sign times its rounding budget (the table of NOTE [ Probable bounds by probes ]).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from parity.claims.compile_bounds import EPS32
from parity.drivers.nn import ce_scales
from reference.layers import LN_EPS

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
