"""The scales S of the gpt eps claims (parity/claims/gpt.py), in float64, in units of eps.

Every function returns S such that the claim is |ref - torch| <= eps S elementwise. The
values an op saw are recomputed here in float64 from the same inputs (first order: the
bound of an op is a function of its inputs, and the rounding of those inputs changes S only
in the second order).

# NOTE [ LayerNorm error budget ]
Per row of C features, between the two trees (each side within the stated half):
    mean:   a C-term sum in any order plus a division:   |d mean| <= C eps m,   m = mean|x|
    var:    the mean's error enters sum (x - mean)^2 only to second order (sum (x - mean) = 0),
            so |d var| <= (C + 3) eps var;   rstd = (var + eps_ln)^(-1/2) adds a square root
            and a division:   |d rstd| <= r eps rstd,   r = (C + 3)/2 + 2 <= C/2 + 4
    y:      (x - mean) rstd w + b:  |w| rstd |d mean| + r eps |w xhat| + 3 eps |w xhat| + eps |y|
            (the subtraction and the two products round once per side, the add once)
            <= eps (|w| (C rstd m + (C/2 + 7) |xhat|) + |y|)
    An incoming difference e of x moves y by |w| rstd (e + <e> + |xhat| <|xhat| e>), the
    absolute value of the Jacobian of NOTE [ LayerNorm backward ] applied to e.
Backward from the same g, each side from its own saved mean and rstd: xhat = (x - mean) rstd
differs by X = rstd |d mean| + |xhat| |d rstd| / rstd + (rstd (|x| + |mean|) + 3 |xhat|) eps/2,
with |d mean| and |d rstd| MEASURED between the two trees' statistics at the same x (the worst
case C rstd m + (r + 2)|xhat| of the forward is about 20x what the statistics really differ by
and made dw's bound blind; the statistics themselves are held by gpt.layer_norm.forward, whose y
carries them); the reference rounds x - mean and the product (2 u |xhat|), torch may form x rstd
+ (-mean rstd) instead, whose roundings are relative to rstd |x| and rstd |mean| (with C = 1,
xhat = 0 exactly in the reference and not in torch). Each mean over C adds C eps of its absolute
terms, each of the three terms of gw - <gw> - xhat <gw xhat> is allowed 2 eps of its magnitude
for reassociation, and dx = rstd T adds (r + 1) eps |dx|. dw = sum_rows g xhat: sum |g| X, one
rounding of each product per side (|g xhat|), then the sum: on CPU with torch on one thread both
sides add the rows in order (NOTE [ Row-order sums ]), elsewhere (N + 1) eps sum |g xhat|.

# NOTE [ Row-order sums ]
A sum computed as a sequence of additions rounds each partial result once: to first order its
error is u sum |partial results| (Higham, Accuracy and Stability, (4.2)), and a term added d times
before the end contributes to d partial results, so for nonnegative terms the error is
u sum_i d_i t_i. Two sides that add the same terms in ANY orders are therefore apart by at most
(u sum |s_k| of one order) + (that of the other), where the worst case over orders is (N - 1) u
sum |t| each: the (N + 1) eps sum |t| allowed when the orders are unknown. When the orders are
KNOWN the actual partial sums are used instead:
    rows in order (dw, db of LayerNorm on CPU, one thread: torch's order, which the reference
        mirrors, NOTE [ LayerNorm row sums on torch's CPU ] in reference/layers.py; on more
        threads torch adds per-thread chunks and the any-order bound is used): eps sum_{k>=2}
        |s_k|, s_k the running sums (row_order_rounding; 0 + t_1 is exact), about sqrt(N) sum |t|
        for terms of mixed sign, not N;
    the loss's mean over N rows: NumPy's add.reduce is 0 plus a pairwise sum (eight running sums
        per block of <= 128 terms, halves above), torch's CPU nll_loss a cascade of 8 levels of
        2^4 terms (numpy_sum_order, torch_nll_sum_order count each term's additions d_i; both
        reproduce the library's sum bit for bit (parity/test_gpt_bounds.py checks it), so the two
        sides differ by u sum_i (d_i^numpy + d_i^torch) nll_i (nll_i >= 0): about (N/8 + 16) u
        per term for N <= 128 rather than (N - 1) eps. On another device torch's reduction
        order is not reproduced here: d_i^torch = N - 1 (any order).

# NOTE [ Cross-entropy of the transformer ]
S (in eps) at torch's logits z (N rows, V classes) and the measured signed difference e = (z_ref -
z_torch) / eps:
    own:      (1/N) sum_i (A + nll_i), A = V + 5 + 5 ln V (nn.cross_entropy's per-row budget: the
              log-softmax in the same operation order, exp, log and a V-term sum per side)
    reduce:   (1/N) u sum_i (d_i^numpy + d_i^torch) nll_i (NOTE [ Row-order sums ]) + |loss| (the
              division by N rounds once per side)
    carried:  |mean_i (<p_i, e_i> - e_i[t_i])| + (eps/2) mean_i max_j e_ij^2: the loss is a smooth
              scalar function of z, so the exact change under the measured e is the gradient
              (p - onehot) / N applied to it (signed: a scalar needs no |J|) plus Taylor's
              remainder, bounded by the Hessian of log-sum-exp, diag(p) - p p^T, whose quadratic
              form is at most max_j e_j^2.

# NOTE [ Attention error budget ]
    s = (q k^T) / sqrt d:  (d + 2) eps |q||k|^T / sqrt d   (+ |e_q||k|^T + |q||e_k|^T, / sqrt d)
    p = softmax(s):        p (E_s + <p, E_s>)  +  p (4 a + T + 2 + |s - max s|)   eps
        (exp within a eps per side, a = 4 for NumPy's float32 SIMD exp, 1 in float64; the sum
        of T terms and the division; s - max s rounds once, exp turns that into relative
        |s - max s| u per side)
    p_d = p * noise:       |noise| E_p + |p_d|
    y = p_d v:             E_pd |v| + |p_d| e_v + (T + 1) |p_d||v|
Backward: dp = (g v^T) noise, sigma = <p, dp>, ds = p (dp - sigma) / sqrt d; products of a
carried error with exact values are first order, every rounding is counted on both sides.

# NOTE [ Forward error propagation ]
Along one run each op is checked at torch's inputs: its own budget plus the MEASURED
difference e of its inputs (in eps) mapped through |its Jacobian| (gpt.logits). Carrying a
bound instead of the measured difference from the embeddings onward is valid but blind: the
LayerNorm's |J| is about rstd |x| ~ 10 on the residual stream, so the bound grows tenfold per
LayerNorm while the real difference does not (2 blocks: ~1e7 above what is observed).
"""

from __future__ import annotations

import math

import numpy as np

from reference.layers import LN_EPS

GELU_LIPSCHITZ = 1.13  # max |GELU'| = 1.1290...


def _exp_ulps(dtype: np.dtype) -> float:
    return 4.0 if np.dtype(dtype) == np.float32 else 1.0


def layer_norm_values(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, rstd) in float64."""
    x = x.astype(np.float64)
    d = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + LN_EPS)
    return d * rstd, rstd


def layer_norm_forward_scale(x: np.ndarray, w: np.ndarray, b: np.ndarray,
                             e: np.ndarray | None = None) -> np.ndarray:
    """S of gpt.layer_norm.forward, plus the carried difference e of x if given."""
    C = x.shape[-1]
    xhat, rstd = layer_norm_values(x)
    aw = np.abs(w.astype(np.float64))
    m = np.abs(x.astype(np.float64)).mean(axis=-1, keepdims=True)
    y = xhat * w.astype(np.float64) + b.astype(np.float64)
    s = aw * (C * rstd * m + (C / 2 + 7) * np.abs(xhat)) + np.abs(y)
    if e is not None:
        ax = np.abs(xhat)
        s = s + aw * rstd * (e + e.mean(axis=-1, keepdims=True)
                             + ax * (ax * e).mean(axis=-1, keepdims=True))
    return s


def row_order_rounding(t: np.ndarray) -> np.ndarray:
    """sum_k |s_k| over the running sums s_2..s_n of t's rows, per column (float64, in units of
    the terms): NOTE [ Row-order sums ]."""
    rows = np.cumsum(t.reshape(-1, t.shape[-1]).astype(np.float64), axis=0)
    return np.abs(rows[1:]).sum(axis=0)


def layer_norm_backward_scales(x: np.ndarray, w: np.ndarray, g: np.ndarray,
                               stats: tuple[np.ndarray, np.ndarray] | None = None,
                               row_order: bool = False
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S_dx, S_dw, S_db) of gpt.layer_norm.backward. `stats`: the measured |d mean| and
    |d rstd| of the two trees' saved statistics (absolute, float64), carried instead of their
    worst case; `row_order`: both sides add the rows one after another (torch's CPU kernel on
    one thread), so dw's and db's sums round by NOTE [ Row-order sums ] instead of (N + 1)."""
    C = x.shape[-1]
    xhat, rstd = layer_norm_values(x)
    ax = np.abs(xhat)
    m = np.abs(x.astype(np.float64)).mean(axis=-1, keepdims=True)
    r = C / 2 + 4
    big_x = C * rstd * m + (r + 2) * ax  # the difference of xhat
    if stats is not None:  # measured: rstd |d mean| + |xhat| |d rstd| / rstd, plus roundings
        eps = float(np.finfo(x.dtype).eps)
        x64 = x.astype(np.float64)
        big_x = ((rstd * stats[0] + ax * stats[1] / rstd) / eps
                 + (rstd * (np.abs(x64) + np.abs(x64.mean(axis=-1, keepdims=True))) + 3 * ax) / 2)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    gw = g64 * w64
    a = np.abs(gw)
    mean_gw = gw.mean(axis=-1, keepdims=True)
    mean_gwx = (gw * xhat).mean(axis=-1, keepdims=True)
    d_mean_gw = C * a.mean(axis=-1, keepdims=True)
    d_mean_gwx = (a * big_x).mean(axis=-1, keepdims=True) + (C + 1) * (a * ax).mean(
        axis=-1, keepdims=True)
    d_t = (d_mean_gw + big_x * np.abs(mean_gwx) + ax * d_mean_gwx
           + 2 * (a + np.abs(mean_gw) + ax * np.abs(mean_gwx)))
    dx = rstd * (gw - mean_gw - xhat * mean_gwx)
    rows = tuple(range(g.ndim - 1))
    n = int(np.prod(g.shape[:-1]))
    ag = np.abs(g64)
    if row_order:  # each term g xhat rounds once per side, then the row-order sum
        s_dw = (ag * big_x).sum(axis=rows) + (ag * ax).sum(axis=rows) + row_order_rounding(
            g64 * xhat)
        s_db = row_order_rounding(g64)
    else:
        s_dw = (ag * big_x).sum(axis=rows) + (n + 1) * (ag * ax).sum(axis=rows)
        s_db = (n + 1) * ag.sum(axis=rows)
    return rstd * d_t + (r + 1) * np.abs(dx), s_dw, s_db


def _scores(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(s, visible, 1/sqrt d) in float64 with the causal mask applied (-inf)."""
    T, hs = q.shape[-2], q.shape[-1]
    c = 1.0 / math.sqrt(hs)
    visible = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(visible, (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) * c,
                 -np.inf)
    return s, visible, c


def attention_forward_scale(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                            noise: np.ndarray | None, e_q: np.ndarray | float = 0.0,
                            e_k: np.ndarray | float = 0.0, e_v: np.ndarray | float = 0.0
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(S_y, S_p): gpt.attention.forward's scale for y, and the softmax's (for backward)."""
    T, hs = q.shape[-2], q.shape[-1]
    a = _exp_ulps(q.dtype)
    s, visible, c = _scores(q, k)
    aq, ak, av = (np.abs(t.astype(np.float64)) for t in (q, k, v))
    kt = np.swapaxes(ak, -1, -2)
    e_q, e_k = np.broadcast_to(e_q, aq.shape), np.broadcast_to(e_k, ak.shape)
    e_s = (hs + 2) * c * (aq @ kt) + c * (e_q @ kt + aq @ np.swapaxes(e_k, -1, -2))
    e_s = np.where(visible, e_s, 0.0)
    shifted = np.where(visible, s - s.max(axis=-1, keepdims=True), 0.0)
    p = np.where(visible, np.exp(shifted), 0.0)
    p = p / p.sum(axis=-1, keepdims=True)
    e_p = p * (e_s + (p * e_s).sum(axis=-1, keepdims=True)) + p * (4 * a + T + 2 + np.abs(shifted))
    n = np.ones(()) if noise is None else np.abs(noise.astype(np.float64))
    p_d = p * n
    e_pd = n * e_p + p_d
    e_y = e_pd @ av + p_d @ np.broadcast_to(e_v, av.shape) + (T + 1) * (p_d @ av)
    return e_y, e_p


def attention_backward_scales(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                              noise: np.ndarray | None, g: np.ndarray
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S_dq, S_dk, S_dv) of gpt.attention.backward."""
    T, hs = q.shape[-2], q.shape[-1]
    _, e_p = attention_forward_scale(q, k, v, noise)
    s, visible, c = _scores(q, k)
    p = np.where(visible, np.exp(np.where(visible, s - s.max(axis=-1, keepdims=True), 0.0)), 0.0)
    p = p / p.sum(axis=-1, keepdims=True)
    q64, k64, v64, g64 = (t.astype(np.float64) for t in (q, k, v, g))
    aq, ak, av, ag = (np.abs(t) for t in (q64, k64, v64, g64))
    n = np.ones(()) if noise is None else noise.astype(np.float64)
    an = np.abs(n)
    dp = (g64 @ np.swapaxes(v64, -1, -2)) * n
    e_dp = an * (hs + 1) * (ag @ np.swapaxes(av, -1, -2)) + np.abs(dp)
    sigma = (p * dp).sum(axis=-1, keepdims=True)
    e_sigma = (e_p * np.abs(dp) + p * e_dp).sum(axis=-1, keepdims=True) + (T + 1) * (
        p * np.abs(dp)).sum(axis=-1, keepdims=True)
    ds = p * (dp - sigma) * c
    e_ds = c * (e_p * np.abs(dp - sigma) + p * (e_dp + e_sigma) + 2 * p * np.abs(dp - sigma))
    e_ds = np.where(visible, e_ds + np.abs(ds), 0.0)
    ads = np.abs(ds)
    e_dq = e_ds @ ak + (T + 1) * (ads @ ak)
    e_dk = np.swapaxes(e_ds, -1, -2) @ aq + (T + 1) * (np.swapaxes(ads, -1, -2) @ aq)
    p_d = p * an
    e_pd = an * e_p + p_d
    e_dv = np.swapaxes(e_pd, -1, -2) @ ag + (T + 1) * (np.swapaxes(p_d, -1, -2) @ ag)
    return e_dq, e_dk, e_dv


def _linear(x: np.ndarray, e: np.ndarray, w: np.ndarray, b: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """y and its carried bound: |W| e + (k + 1)(|x||W|^T + |b|) (nn.linear)."""
    w64 = w.astype(np.float64)
    y = x @ w64.T + (0.0 if b is None else b.astype(np.float64))
    ab = 0.0 if b is None else np.abs(b.astype(np.float64))
    return y, e @ np.abs(w64).T + (w.shape[1] + 1) * (np.abs(x) @ np.abs(w64).T + ab)


def linear_carried(x: np.ndarray, e: np.ndarray, w: np.ndarray, b: np.ndarray | None
                   ) -> np.ndarray:
    """nn.linear's scale at x plus the carried difference e of x: |W| e + (k+1)(|x||W|^T+|b|)."""
    x64 = x.astype(np.float64).reshape(-1, w.shape[1])
    return _linear(x64, e.reshape(x64.shape), w, b)[1].reshape(*x.shape[:-1], w.shape[0])


def _pairwise(v: np.ndarray, lo: int, n: int, depth: np.ndarray) -> tuple[object, list[int]]:
    """NumPy's pairwise_sum of v[lo:lo + n] in v's dtype, counting each term's additions."""
    dt = v.dtype.type

    def add(a: tuple, b: tuple) -> tuple:
        depth[a[1] + b[1]] += 1
        return dt(a[0] + b[0]), a[1] + b[1]

    if n < 8:
        res: tuple = (dt(0), [])
        for i in range(lo, lo + n):
            res = add(res, (v[i], [i]))
        return res
    if n <= 128:
        r = [(v[lo + j], [lo + j]) for j in range(8)]
        for i in range(8, n - n % 8, 8):
            r = [add(r[j], (v[lo + i + j], [lo + i + j])) for j in range(8)]
        res = add(add(add(r[0], r[1]), add(r[2], r[3])), add(add(r[4], r[5]), add(r[6], r[7])))
        for i in range(lo + n - n % 8, lo + n):
            res = add(res, (v[i], [i]))
        return res
    half = n // 2 - (n // 2) % 8
    return add(_pairwise(v, lo, half, depth), _pairwise(v, lo + half, n - half, depth))


def numpy_sum_order(v: np.ndarray) -> tuple[np.generic, np.ndarray]:
    """(sum, additions per term) of a 1-D np.add.reduce: 0 plus the pairwise sum of all n
    terms (eight running sums per block of <= 128, halves above). NOTE [ Row-order sums ]."""
    depth = np.zeros(v.size, np.int64)
    total, _ = _pairwise(v, 0, v.size, depth)
    return v.dtype.type(v.dtype.type(0) + total), depth + 1  # type: ignore[operator]


def torch_nll_sum_order(v: np.ndarray, levels: int = 8) -> tuple[np.generic, np.ndarray]:
    """(sum, additions per term) of torch's CPU nll_loss reduction: a cascade of `levels`
    partial sums, level j + 1 taking level j's every 2^p terms, p = max(4, ceil(log2 N) / 8),
    then the levels added in order. NOTE [ Row-order sums ]."""
    dt, n = v.dtype.type, v.size
    power = max(4, math.ceil(math.log2(max(n, 1))) // levels)
    mask = (1 << power) - 1
    sums: list[tuple] = [(dt(0), []) for _ in range(levels)]
    depth = np.zeros(n, np.int64)

    def add(a: tuple, b: tuple) -> tuple:
        depth[a[1] + b[1]] += 1
        return dt(a[0] + b[0]), a[1] + b[1]

    for b in range(n):
        sums[0] = add(sums[0], (v[b], [b]))
        for j in range(levels - 1):
            if b & (mask << (j * power)):
                break
            sums[j + 1], sums[j] = add(sums[j + 1], sums[j]), (dt(0), [])
    total: tuple = (dt(0), [])
    for s in sums:
        total = add(total, s)
    return total[0], depth


def loss_scale(logits: np.ndarray, targets: np.ndarray, e: np.ndarray,
               cpu: bool = True) -> float:
    """S of gpt.loss at torch's logits (N, V) with the measured signed logits difference e
    (reference - torch, in eps): NOTE [ Cross-entropy of the transformer ]. `cpu`: torch's
    reduction is its CPU cascade; otherwise any order (each term up to N - 1 additions)."""
    z = logits.astype(np.float64)
    N, V = z.shape
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    nll = -np.log(np.take_along_axis(p, targets.reshape(-1, 1), 1)[:, 0])
    own = (V + 5 + 5 * math.log(V) + nll).sum()  # nn.cross_entropy's per-row budget
    depths = numpy_sum_order(nll)[1] + (torch_nll_sum_order(nll)[1] if cpu
                                        else max(N - 1, 1))
    reduction = 0.5 * (depths * nll).sum()
    eps = float(np.finfo(logits.dtype).eps)
    e_t = np.take_along_axis(e, targets.reshape(-1, 1), 1)[:, 0]
    carried = abs(((p * e).sum(-1) - e_t).mean()) + 0.5 * eps * (np.abs(e).max(-1) ** 2).mean()
    return float((own + reduction) / N + nll.mean() + carried)
