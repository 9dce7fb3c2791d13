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
Backward from the same g: xhat differs by X = C rstd m + (r + 2)|xhat| (in eps), each mean over
C adds C eps of its absolute terms, each of the three terms of gw - <gw> - xhat <gw xhat> is
allowed 2 eps of its magnitude for reassociation, and dx = rstd T adds (r + 1) eps |dx|.

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


def layer_norm_backward_scales(x: np.ndarray, w: np.ndarray, g: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S_dx, S_dw, S_db) of gpt.layer_norm.backward."""
    C = x.shape[-1]
    xhat, rstd = layer_norm_values(x)
    ax = np.abs(xhat)
    m = np.abs(x.astype(np.float64)).mean(axis=-1, keepdims=True)
    r = C / 2 + 4
    big_x = C * rstd * m + (r + 2) * ax  # the difference of xhat
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
    return (rstd * d_t + (r + 1) * np.abs(dx),
            (ag * big_x).sum(axis=rows) + (n + 1) * (ag * ax).sum(axis=rows),
            (n + 1) * ag.sum(axis=rows))


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
