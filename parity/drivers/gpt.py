"""Running the compact transformer in both trees (the scales of its claims:
parity/claims/gpt_bounds.py).

The torch side runs on `device`; results come back as NumPy arrays. Dropout: torch draws
its masks (NOTE [ Dropout mask ]); `run_torch` reads each nn.Dropout's keep-mask from what
its backward saved, and `run_ref` replays them into the reference's Dropout modules through
`ReplayDraws`, a stand-in generator whose draws reproduce a given mask.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from parity.drivers.nn import TORCH_DTYPE, dropout_keep
from parity.drivers.nn import to_numpy as _to_numpy
from reference import gpt as rgpt
from reference import nn as rnn
from reference.layers import LayerNorm
from torch_impl import attention as tattn
from torch_impl import gpt as tgpt
from torch_impl.state_mapping import state_dict_from_torch, state_dict_to_torch

GPTConfig = rgpt.GPTConfig


def make_pair(config: GPTConfig, dtype: type = np.float32, seed: int = 0,
              device: str = "cpu", affine: bool = False) -> tuple[rgpt.GPT, tgpt.GPT]:
    """A reference GPT and a torch GPT holding the same weights (the reference's, copied).
    `affine`: every LayerNorm's weight drawn around 1 and bias around 0 instead of GPT's
    ones and zeros, so that a gradient or product that forgets (or wrongly applies) the
    affine parameters is seen."""
    ref = rgpt.GPT(config, rng=np.random.default_rng(seed), dtype=dtype)
    if affine:
        rng = np.random.default_rng(seed + 7919)
        for _, m in ref.named_modules():
            if isinstance(m, LayerNorm):
                C = m.normalized_shape
                m.weight.data = (1 + 0.25 * rng.standard_normal(C)).astype(dtype)
                m.bias.data = (0.1 * rng.standard_normal(C)).astype(dtype)
    twin = tgpt.GPT(config, generator=torch.Generator().manual_seed(seed),
                    dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    twin.load_state_dict(state_dict_to_torch(ref.state_dict(), device))
    return ref, twin


def tokens(config: GPTConfig, batch: int, seq_len: int, seed: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """(idx, targets): uniform random token ids, int64 (B, T) each, separate arrays."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, config.vocab_size, (batch, seq_len), dtype=np.int64),
            rng.integers(0, config.vocab_size, (batch, seq_len), dtype=np.int64))


def to_torch_tokens(a: np.ndarray, device: str = "cpu") -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True)).to(device)


class ReplayDraws:
    """A generator stand-in for one reference Dropout: `random(shape)` returns 0 where the
    given keep-mask is True and 1 where it is False, so `random < 1 - p` reproduces it."""

    def __init__(self, keep: np.ndarray) -> None:
        self.keep = keep

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        if tuple(shape) != self.keep.shape:
            raise ValueError(f"ReplayDraws: asked for {tuple(shape)}, holds {self.keep.shape}")
        return np.where(self.keep, 0.0, 1.0)


def replay_masks(ref: rnn.Module, keeps: dict[str, np.ndarray], prefix: str = "") -> None:
    """Make each reference Dropout named in `keeps` draw that keep-mask on its next forward."""
    modules = dict(ref.named_modules(prefix))
    for path, keep in keeps.items():
        modules[path].rng = ReplayDraws(keep)  # type: ignore[assignment]


@dataclass
class TorchRun:
    """What one torch forward and backward produced, as NumPy arrays."""

    logits: np.ndarray
    loss: np.ndarray
    grads: dict[str, np.ndarray]
    keeps: dict[str, np.ndarray]  # dropout path -> keep-mask
    # module path -> (inputs, output, grads of the inputs, grad of the output)
    layers: dict[str, tuple[list[np.ndarray], np.ndarray, list[np.ndarray | None],
                            np.ndarray]] = field(default_factory=dict)


_CAPTURED = (torch.nn.LayerNorm, torch.nn.Linear, torch.nn.GELU, torch.nn.Embedding,
             tattn.AttentionCore)


def run_torch(model: tgpt.GPT, idx: np.ndarray, targets: np.ndarray,
              device: str = "cpu", layerwise: bool = False,
              autocast: torch.dtype | None = None, seed: int = 0) -> TorchRun:
    """Forward with targets, backward of the loss; every dropout's keep-mask and, if asked,
    each captured module's inputs and output (forward hooks) and the gradients of its own
    inputs and output (full backward hooks: a module's own contribution, not the residual
    stream's total). With `autocast` the forward runs inside torch.autocast of that dtype
    (the backward outside, as torch recommends) and lp tensors come back widened to float32.
    Torch's generator is seeded with `seed` inside a forked RNG state, so the dropout masks
    (replayed into the reference) and the report's figures are the same on every run, and
    the caller's generator is left as it was."""
    keeps: dict[str, torch.Tensor] = {}
    seen: dict[str, tuple[list[torch.Tensor], torch.Tensor]] = {}
    grads: dict[str, tuple[list[torch.Tensor | None], torch.Tensor]] = {}
    handles = []
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout):
            def on_drop(mod: torch.nn.Module, args: tuple, out: torch.Tensor,
                        path: str = path) -> None:
                if mod.training and 0 < mod.p and out.grad_fn is not None:
                    keeps[path] = out

            handles.append(module.register_forward_hook(on_drop))
        elif layerwise and isinstance(module, _CAPTURED):
            def on_layer(mod: torch.nn.Module, args: tuple, out: torch.Tensor,
                         path: str = path) -> None:
                seen[path] = ([a.detach().clone() for a in args], out.detach().clone())
                if isinstance(mod, torch.nn.Embedding):  # integer input: hook the output
                    out.register_hook(lambda g, path=path: grads.__setitem__(path, ([None], g)))

            def on_grad(mod: torch.nn.Module, grad_in: tuple, grad_out: tuple,
                        path: str = path) -> None:
                grads[path] = (list(grad_in), grad_out[0])

            handles.append(module.register_forward_hook(on_layer))
            if not isinstance(module, torch.nn.Embedding):
                handles.append(module.register_full_backward_hook(on_grad))
    kind = torch.device(device).type
    try:
        with torch.random.fork_rng(devices=[] if kind == "cpu" else None, device_type=kind):
            torch.manual_seed(seed)
            with torch.autocast(kind, dtype=autocast or torch.float32,
                                enabled=autocast is not None):
                logits, loss = model(to_torch_tokens(idx, device),
                                     to_torch_tokens(targets, device))
        keep_masks = {path: dropout_keep(out) for path, out in keeps.items()}
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    def to_numpy(t: torch.Tensor) -> np.ndarray:  # lp widened exactly
        return _to_numpy(t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)

    layers = {path: ([to_numpy(a) for a in args], to_numpy(out),
                     [None if g is None else to_numpy(g) for g in grads[path][0]],
                     to_numpy(grads[path][1]))
              for path, (args, out) in seen.items()}
    return TorchRun(to_numpy(logits), to_numpy(loss),
                    {k: to_numpy(p.grad) for k, p in model.named_parameters()}, keep_masks,
                    layers)


def run_ref(model: rgpt.GPT, idx: np.ndarray, targets: np.ndarray,
            keeps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray,
                                                   dict[str, np.ndarray]]:
    """(logits, loss, grads) of the reference with torch's dropout masks replayed."""
    replay_masks(model, keeps)
    model.zero_grad()
    logits, loss = model.forward(idx, targets)
    model.backward()
    return logits, np.asarray(loss), {k: p.grad for k, p in model.named_parameters()}


def run_ref_autocast(model: rgpt.GPT, idx: np.ndarray, targets: np.ndarray,
                     keeps: dict[str, np.ndarray], fmt: str, kind: str
                     ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """run_ref with the forward inside reference.amp.autocast(fmt, kind)."""
    from reference import amp as ramp

    replay_masks(model, keeps)
    model.zero_grad()
    with ramp.autocast(fmt, kind):
        logits, loss = model.forward(idx, targets)
    model.backward()
    return logits, np.asarray(loss), {k: p.grad for k, p in model.named_parameters()}


def dropout_noise(model: rgpt.GPT) -> dict[str, np.ndarray | None]:
    """Each reference Dropout's saved scaled noise (after a forward), None where none."""
    return {path: m.saved_tensors().get("mask") for path, m in model.named_modules()
            if isinstance(m, rnn.Dropout)}


# -- the sdpa model against the reference: NOTE [ The fused CPU kernel's error budget ]
# in parity/claims/gpt.py (gpt.sdpa_logits)
SDPA_KV_BLOCK = 512  # keys per block of torch's CPU flash kernel: one block, no rescaling
SDPA_EXP_ULPS = {np.dtype(np.float32): 20.0, np.dtype(np.float64): 1.0}  # exp_u20, Sleef u10


def sdpa_core_scale(q: np.ndarray, k: np.ndarray, v: np.ndarray, y: np.ndarray,
                    e_q: np.ndarray, e_k: np.ndarray, e_v: np.ndarray) -> np.ndarray:
    """S of gpt.sdpa_logits at one attention core, at torch's q, k, v (and output y) with the
    measured input differences e (in eps): gpt.attention.forward's carried budget, plus
    2 (a_sdpa - a) p|v| for the kernel's coarser exp and |y| for its reciprocal-then-multiply
    normalization."""
    from parity.claims import gpt_bounds as gb

    T = q.shape[-2]
    if T > SDPA_KV_BLOCK:
        raise ValueError(f"sdpa_core_scale: T={T} > {SDPA_KV_BLOCK} keys is more than one "
                         "block of the CPU kernel (its rescaling is not budgeted)")
    base = gb.attention_forward_scale(q, k, v, None, e_q, e_k, e_v)[0]
    s = (q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)) / np.sqrt(q.shape[-1])
    visible = np.tril(np.ones((T, T), dtype=bool))
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    a_extra = max(SDPA_EXP_ULPS[q.dtype] - gb._exp_ulps(q.dtype), 0.0)  # a per side there
    return base + 2 * a_extra * (p @ np.abs(v.astype(np.float64))) + np.abs(y.astype(np.float64))


def saved_counts(entries: list) -> Counter:
    """(module, torch node.attr, shape, dtype, bytes) -> count; the reference's op-local
    prefix ("qk:") dropped."""
    return Counter((e.module, e.name.split(":")[-1], tuple(e.shape), e.dtype, e.nbytes)
                   for e in entries)


def saved_both(config: GPTConfig, dtype: type, idx: np.ndarray, targets: np.ndarray,
               seed: int = 0, device: str = "cpu") -> tuple[Counter, int, Counter, int]:
    """(reference entries, reference held bytes, torch entries, torch held bytes) after one
    forward with targets on the same weights."""
    ref, twin = make_pair(config, dtype, seed, device)
    ref.forward(idx, targets)
    entries, held = tgpt.measure_saved(twin, to_torch_tokens(idx, device),
                                       to_torch_tokens(targets, device))
    return saved_counts(ref.tape()), ref.held_bytes(), saved_counts(entries), held


def state_dict_roundtrip(ref: rgpt.GPT, device: str = "cpu") -> dict[str, np.ndarray]:
    """reference state_dict -> torch GPT -> its state_dict as NumPy arrays."""
    twin = tgpt.GPT(ref.config, generator=torch.Generator().manual_seed(1),
                    dtype=TORCH_DTYPE[ref.lm_head.weight.data.dtype], device=device)
    twin.load_state_dict(state_dict_to_torch(ref.state_dict(), device))
    return state_dict_from_torch(twin.state_dict())


# -- the boundary: the same bad input gives the same error class in both trees
def bad_inputs(config: GPTConfig) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Named (idx, targets) pairs that both trees must refuse."""
    B, T, V = 2, min(4, config.block_size), config.vocab_size
    good = np.zeros((B, T), dtype=np.int64)
    return {
        "float ids": (good.astype(np.float32), None),
        "int32 ids": (good.astype(np.int32), None),
        "1-d ids": (good[0], None),
        "T > block_size": (np.zeros((B, config.block_size + 1), dtype=np.int64), None),
        "empty batch": (np.zeros((0, T), dtype=np.int64), None),
        "id = vocab_size": (np.full((B, T), V, dtype=np.int64), None),
        "negative id": (np.full((B, T), -1, dtype=np.int64), None),
        "target out of range": (good, np.full((B, T), V, dtype=np.int64)),
        "targets of another shape": (good, np.zeros((B, T + 1) if T < config.block_size
                                                    else (B + 1, T), dtype=np.int64)),
    }


def error_of(fn: Callable[[], object]) -> tuple[type | None, str]:
    try:
        fn()
    except Exception as exc:  # the class is the observation
        return type(exc), str(exc)
    return None, ""


def boundary_errors(config: GPTConfig, idx: np.ndarray, targets: np.ndarray | None,
                    device: str = "cpu") -> tuple[tuple[type | None, str], tuple[type | None, str]]:
    """(reference error, torch error) for one bad input."""
    ref, twin = make_pair(config, np.float32, 0, device)
    t_idx = torch.from_numpy(np.array(idx, copy=True)).to(device)
    t_tgt = None if targets is None else torch.from_numpy(np.array(targets, copy=True)).to(device)
    return (error_of(lambda: ref.forward(idx, targets)),
            error_of(lambda: twin(t_idx, t_tgt)))


def reference_module(ref: rgpt.GPT, path: str) -> rnn.Module:
    return dict(ref.named_modules())[path]


def torch_flops(config: GPTConfig, batch: int, seq_len: int, seed: int) -> int:
    """FlopCounterMode's total for one forward with targets and backward (CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    _, twin = make_pair(config, np.float32, seed % 1000)
    idx, targets = tokens(config, batch, seq_len, seed)
    with FlopCounterMode(display=False) as counter:
        twin(to_torch_tokens(idx), to_torch_tokens(targets))[1].backward()
    return int(counter.get_total_flops())


# -- the initialization: gpt.init (statistical) and gpt.init_constants (bits)
class RecordingDraws(np.random.Generator):
    """np.random.default_rng(seed)'s generator (PCG64, the same draws) that keeps each normal
    draw as (mean, std, values), so the reference's own init rule says which std drew which
    parameter."""

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.PCG64(seed))
        self.normals: list[tuple[float, float, np.ndarray]] = []

    def normal(self, loc: float = 0.0, scale: float = 1.0,  # type: ignore[override]
               size: tuple[int, ...] | None = None) -> np.ndarray:
        out = super().normal(loc, scale, size)
        self.normals.append((float(loc), float(scale), np.asarray(out)))
        return out


def reference_init(config: GPTConfig, seed: int = 0
                   ) -> dict[str, tuple[float, float] | np.ndarray]:
    """Per parameter name of the reference GPT: (mean, std) of the normal draw it holds, or,
    for a parameter no normal draw made (LayerNorm weights and biases, Linear biases), its
    constant value."""
    draws = RecordingDraws(seed)
    ref = rgpt.GPT(config, rng=draws, dtype=np.float32)
    out: dict[str, tuple[float, float] | np.ndarray] = {}
    for name, value in ref.state_dict().items():
        drawn = [(m, s) for m, s, v in draws.normals
                 if v.shape == value.shape and np.array_equal(v.astype(value.dtype), value)]
        out[name] = drawn[-1] if drawn else value
    return out


def chi2_cdf(q: float, n: int) -> tuple[float, float]:
    """(P(chi2_n <= q), P(chi2_n > q)), regularized incomplete gamma in float64."""
    a, x = torch.tensor(n / 2, dtype=torch.float64), torch.tensor(q / 2, dtype=torch.float64)
    return float(torch.special.gammainc(a, x)), float(torch.special.gammaincc(a, x))


def chi2_quantiles(n: int, tail: float) -> tuple[float, float]:
    """(q_lo, q_hi) with P(chi2_n <= q_lo) = P(chi2_n > q_hi) = tail, by bisection."""
    def solve(lower: bool) -> float:
        lo, hi = 0.0, n + 100 * math.sqrt(2 * n) + 100
        for _ in range(200):
            mid = (lo + hi) / 2
            below, above = chi2_cdf(mid, n)
            if (below < tail) if lower else (above > tail):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2
    return solve(True), solve(False)


def variance_test_power(n: int, alpha: float, ratio: float) -> float:
    """Power of the two-sided chi-square variance test at level alpha against a std `ratio`
    times the stated one: P(ratio^2 chi2_n outside [q_lo, q_hi])."""
    q_lo, q_hi = chi2_quantiles(n, alpha / 2)
    r2 = ratio * ratio
    return chi2_cdf(q_lo / r2, n)[0] + chi2_cdf(q_hi / r2, n)[1]


@dataclass
class InitTest:
    """One parameter's statistics against the reference's (mean, std): the two-sided p-values
    of its sample mean (z) and of its sum of squares (chi-square, n degrees of freedom)."""

    name: str
    n: int
    std: float
    p_mean: float
    p_var: float


def torch_init_tests(config: GPTConfig, seed: int, device: str = "cpu"
                     ) -> tuple[list[InitTest], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The torch GPT drawn from torch.Generator(seed) against the reference's init rule:
    (a test per normally drawn parameter, {name: (torch value, reference constant)} for the
    rest). Tied weights are one parameter, tested once."""
    expected = reference_init(config, seed)
    model = tgpt.GPT(config, generator=torch.Generator().manual_seed(seed), device=device)
    tests, constants = [], {}
    for name, t in model.named_parameters():
        x = t.detach().cpu().numpy()
        rule = expected[name]
        if isinstance(rule, np.ndarray):
            constants[name] = (x, rule)
            continue
        mean, std = rule
        d = x.astype(np.float64).reshape(-1) - mean
        n = d.size
        z = float(d.mean()) * math.sqrt(n) / std
        below, above = chi2_cdf(float(d @ d) / (std * std), n)
        tests.append(InitTest(name, n, std, math.erfc(abs(z) / math.sqrt(2)),
                              min(1.0, 2 * min(below, above))))
    return tests, constants
