"""Running the compact transformer in both trees (the scales of its claims:
parity/drivers/gpt_bounds.py).

The torch side runs on `device`; results come back as NumPy arrays. Dropout: torch draws
its masks (NOTE [ Dropout mask ]); `run_torch` reads each nn.Dropout's keep-mask from what
its backward saved, and `run_ref` replays them into the reference's Dropout modules through
`ReplayDraws`, a stand-in generator whose draws reproduce a given mask.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from parity.drivers import gpt_bounds as gb
from parity.drivers.nn import TORCH_DTYPE, ce_scales, dropout_keep, linear_scales, to_numpy
from parity.drivers.nn import run_ref as run_ref_layer
from parity.tolerances import claim
from reference import attention as rattn
from reference import gpt as rgpt
from reference import nn as rnn
from reference.layers import Embedding, LayerNorm
from torch_impl import gpt as tgpt
from torch_impl.module import state_dict_from_torch, state_dict_to_torch

GPTConfig = rgpt.GPTConfig


def make_pair(config: GPTConfig, dtype: type = np.float32, seed: int = 0,
              device: str = "cpu") -> tuple[rgpt.GPT, tgpt.GPT]:
    """A reference GPT and a torch GPT holding the same weights (the reference's, copied)."""
    ref = rgpt.GPT(config, rng=np.random.default_rng(seed), dtype=dtype)
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
             tgpt.AttentionCore)


def run_torch(model: tgpt.GPT, idx: np.ndarray, targets: np.ndarray,
              device: str = "cpu", layerwise: bool = False) -> TorchRun:
    """Forward with targets, backward of the loss; every dropout's keep-mask and, if asked,
    each captured module's inputs and output (forward hooks) and the gradients of its own
    inputs and output (full backward hooks: a module's own contribution, not the residual
    stream's total)."""
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
    try:
        logits, loss = model(to_torch_tokens(idx, device), to_torch_tokens(targets, device))
        keep_masks = {path: dropout_keep(out) for path, out in keeps.items()}
        loss.backward()
    finally:
        for h in handles:
            h.remove()
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


def dropout_noise(model: rgpt.GPT) -> dict[str, np.ndarray | None]:
    """Each reference Dropout's saved scaled noise (after a forward), None where none."""
    return {path: m.saved_tensors().get("mask") for path, m in model.named_modules()
            if isinstance(m, rnn.Dropout)}


# -- the saved tensors
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



# -- op by op along one run (the carried claims)
_RECORDED = (rnn.Linear, rnn.GELU, LayerNorm, rattn.AttentionCore)


def record_ref(model: rgpt.GPT, idx: np.ndarray, targets: np.ndarray,
               keeps: dict[str, np.ndarray], backward: bool = False
               ) -> tuple[dict[str, tuple[list[np.ndarray], np.ndarray]], dict[str, np.ndarray]]:
    """One reference forward with torch's masks replayed, recording each LayerNorm, Linear,
    GELU and attention core's inputs and output by module path, and with `backward` the
    backward too, recording the incoming gradient of each LayerNorm, Linear and Embedding
    (the instances' methods are wrapped for this call only)."""
    replay_masks(model, keeps)
    seen: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}
    gouts: dict[str, np.ndarray] = {}
    wrapped = []
    for path, m in model.named_modules():
        if isinstance(m, _RECORDED):
            def rec(*args: np.ndarray, _f: Callable = m.forward, _p: str = path) -> np.ndarray:
                out = _f(*args)
                seen[_p] = (list(args), out)
                return out

            m.forward = rec  # type: ignore[method-assign]
            wrapped.append((m, "forward"))
        if backward and isinstance(m, rnn.Linear | LayerNorm | Embedding):
            def rec_back(g: np.ndarray, _f: Callable = m.backward, _p: str = path) -> object:
                gouts[_p] = g
                return _f(g)

            m.backward = rec_back  # type: ignore[method-assign]
            wrapped.append((m, "backward"))
    try:
        model.zero_grad()
        model.forward(idx, targets)
        if backward:
            model.backward()
    finally:
        for m, name in wrapped:
            delattr(m, name)
        model.free_saved()
    return seen, gouts


def carried_scale(module: rnn.Module, ins: list[np.ndarray], t_ins: list[np.ndarray],
                  noise: np.ndarray | None, gelu_bound: float) -> np.ndarray:
    """S for one op's output along a run: its own budget at torch's inputs plus the measured
    difference of its inputs (in eps) carried through |its Jacobian| (gpt.logits)."""
    eps = float(np.finfo(ins[0].dtype).eps)
    e = [np.abs(a.astype(np.float64) - b.astype(np.float64)) / eps
         for a, b in zip(ins, t_ins, strict=True)]
    if isinstance(module, LayerNorm):
        return gb.layer_norm_forward_scale(t_ins[0], module.weight.data, module.bias.data, e[0])
    if isinstance(module, rattn.AttentionCore):
        return gb.attention_forward_scale(*t_ins, noise, *e)[0]
    if isinstance(module, rnn.GELU):
        return gb.GELU_LIPSCHITZ * e[0] + gelu_bound * np.abs(t_ins[0].astype(np.float64))
    b = None if module.bias is None else module.bias.data  # type: ignore[attr-defined]
    return gb.linear_carried(t_ins[0], e[0], module.weight.data, b)  # type: ignore[attr-defined]


Pair = tuple[str, str, np.ndarray, np.ndarray, np.ndarray | None]  # claim, where, a, b, S


def _module_pairs(path: str, module: rnn.Module, captured: tuple, noise: np.ndarray | None,
                  grads: dict[str, np.ndarray], compared: set[str]) -> list[Pair]:
    """One reference module run on torch's inputs and incoming gradient: (claim, where,
    reference, torch, S) for its output, input gradients and parameter gradients."""
    ins, t_out, t_gins, g = captured
    where = f"{path} ({ins[0].dtype})"
    if isinstance(module, Embedding):
        module.zero_grad()
        y = module.forward(ins[0])
        module.backward(g)
        compared.add(path + ".weight")
        return [("gpt.embedding", f"{where} y", y, t_out, None),
                ("gpt.embedding", f"{where} dW", module.weight.grad, grads[path + ".weight"],
                 None)]
    if isinstance(module, LayerNorm):
        module.zero_grad()
        y = module.forward(ins[0])
        dx = module.backward(g)
        s_dx, s_dw, _ = gb.layer_norm_backward_scales(ins[0], module.weight.data, g)
        compared.update({path + ".weight", path + ".bias"})
        return [("gpt.layer_norm.forward", f"{where} y", y, t_out,
                 gb.layer_norm_forward_scale(ins[0], module.weight.data, module.bias.data)),
                ("gpt.layer_norm.backward", f"{where} dx", dx, t_gins[0], s_dx),
                ("gpt.layer_norm.backward", f"{where} dw", module.weight.grad,
                 grads[path + ".weight"], s_dw),
                ("gpt.layer_norm.bias_grad", f"{where} db", module.bias.grad,
                 grads[path + ".bias"], None)]
    if isinstance(module, rattn.AttentionCore):
        y = module.forward(*ins)
        d_ins = module.backward(g)
        out = [("gpt.attention.forward", f"{where} y", y, t_out,
                gb.attention_forward_scale(*ins, noise)[0])]
        scales = gb.attention_backward_scales(*ins, noise, g)
        return out + [("gpt.attention.backward", f"{where} d{n}", d, td, s)
                      for n, d, td, s in zip("qkv", d_ins, t_gins, scales, strict=True)]
    if isinstance(module, rnn.Linear):
        y, dx, pgrads = run_ref_layer(module, ins[0], g)
        s = linear_scales(module, ins[0], g)
        compared.update(f"{path}.{key}" for key in pgrads)
        return [("nn.linear", f"{where} y", y, t_out, s["y"]),
                ("nn.linear", f"{where} dx", dx, t_gins[0], s["dx"])] + [
                ("nn.linear", f"{where} {key}", grad, grads[f"{path}.{key}"], s[key])
                for key, grad in pgrads.items()]
    y, dx, _ = run_ref_layer(module, ins[0], g)  # GELU
    ax, ag = np.abs(ins[0].astype(np.float64)), np.abs(g.astype(np.float64))
    return [("nn.gelu_tanh.forward", f"{where} y", y, t_out, ax),
            ("nn.gelu_tanh.backward", f"{where} dx", dx, t_gins[0],
             ag * (1 + ax * (1 + ax * ax)))]


def layerwise_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int
                    ) -> tuple[list[Pair], set[str], set[str]]:
    """Every captured op of an untied model fed torch's own inputs and incoming gradient:
    (pairs, parameter names compared, all parameter names). CPU."""
    ref, twin = make_pair(config, dtype, seed % 1000)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, layerwise=True)
    modules = dict(ref.named_modules())
    pairs: list[Pair] = []
    compared: set[str] = set()
    for path, captured in run.layers.items():
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None
        if keep is not None:
            replay_masks(modules[path], {"attn_dropout": keep})
            noise = keep.astype(dtype) / dtype(1 - config.dropout)
        pairs += _module_pairs(path, modules[path], captured, noise, run.grads, compared)
    return pairs, compared, {name for name, _ in ref.named_parameters()}


def _residual_pairs(config: GPTConfig, dtype: type, seen: dict, run: TorchRun) -> list[Pair]:
    """gpt.logits for the glue between the ops: each LayerNorm's input (the residual stream)
    against the previous one plus the branch's c_proj output, carried, with the dropout
    product and the add rounding once each (the first: embeddings and their sum, exact)."""
    eps = float(np.finfo(dtype).eps)
    scale = 1.0 / (1.0 - config.dropout)

    def diff(path: str, which: int) -> tuple[np.ndarray, np.ndarray]:
        t = (run.layers[path][0][0] if which == 0 else run.layers[path][1]).astype(np.float64)
        r = (seen[path][0][0] if which == 0 else seen[path][1]).astype(np.float64)
        return t, np.abs(r - t) / eps

    def noise(path: str) -> np.ndarray | float:
        keep = run.keeps.get(path)
        return 1.0 if keep is None else keep * scale

    stream = [f"transformer.h.{i}.{ln}" for i in range(config.n_layer) for ln in ("ln_1", "ln_2")]
    stream.append("transformer.ln_f")
    x, e = diff(stream[0], 0)
    out = [("gpt.logits", stream[0] + " input", seen[stream[0]][0][0], run.layers[stream[0]][0][0],
            np.abs(x))]
    for prev, ln in itertools.pairwise(stream):
        block = prev.rsplit(".", 1)[0]
        branch = f"{block}.attn" if prev.endswith("ln_1") else f"{block}.mlp"
        drop = f"{branch}.resid_dropout" if prev.endswith("ln_1") else f"{branch}.dropout"
        y, e_y = diff(f"{branch}.c_proj", 1)
        n = noise(drop)
        x_new, _ = diff(ln, 0)
        s = e + np.abs(n) * e_y + np.abs(n * y) + np.abs(x_new)
        out.append(("gpt.logits", ln + " input (residual)", seen[ln][0][0],
                    run.layers[ln][0][0], s))
        x, e = x_new, np.abs(seen[ln][0][0].astype(np.float64) - x_new) / eps
    return out


def carried_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int,
                  device: str = "cpu") -> list[Pair]:
    """gpt.logits for every op along one end-to-end forward, then gpt.loss."""
    ref, twin = make_pair(config, dtype, seed % 1000, device)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, device=device, layerwise=True)
    seen, _ = record_ref(ref, idx, targets, run.keeps)
    modules = dict(ref.named_modules())
    gelu = float(claim("nn.gelu_tanh.forward").bound)  # type: ignore[arg-type]
    pairs: list[Pair] = []
    for path, (ins, out) in seen.items():
        t_ins, t_out = run.layers[path][0], run.layers[path][1]
        keep = run.keeps.get(path + ".attn_dropout")
        noise = None if keep is None else keep.astype(dtype) / dtype(1 - config.dropout)
        pairs.append(("gpt.logits", path, out, t_out,
                      carried_scale(modules[path], ins, t_ins, noise, gelu)))
    pairs += _residual_pairs(config, dtype, seen, run)
    logits, loss = run_ref(ref, idx, targets, run.keeps)[:2]
    V = config.vocab_size
    flat, t_flat = logits.reshape(-1, V), run.logits.reshape(-1, V)
    e = np.abs(flat.astype(np.float64) - t_flat.astype(np.float64)) / float(np.finfo(dtype).eps)
    t64 = t_flat.astype(np.float64)
    p = np.exp(t64 - t64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    carried = (np.take_along_axis(e, targets.reshape(-1, 1), 1)[:, 0] + (p * e).sum(-1)).mean()
    s_loss = ce_scales("mean", t_flat, targets.reshape(-1), np.asarray(1.0, dtype),
                       np.zeros_like(t_flat))[0]
    return [*pairs, ("gpt.loss", "loss", loss, run.loss, s_loss + carried)]


def torch_flops(config: GPTConfig, batch: int, seq_len: int, seed: int) -> int:
    """FlopCounterMode's total for one forward with targets and backward (CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    _, twin = make_pair(config, np.float32, seed % 1000)
    idx, targets = tokens(config, batch, seq_len, seed)
    with FlopCounterMode(display=False) as counter:
        twin(to_torch_tokens(idx), to_torch_tokens(targets))[1].backward()
    return int(counter.get_total_flops())


def _param_grad_scales(module: rnn.Module, x: np.ndarray, e_x: np.ndarray, g: np.ndarray,
                       e_g: np.ndarray) -> dict[str, np.ndarray]:
    """gpt.grads: each parameter gradient's own budget at torch's x and g plus the measured
    differences e_x of the module's input and e_g of its incoming gradient (in eps)."""
    ag = np.abs(g.astype(np.float64))
    if isinstance(module, Embedding):
        flat = x.reshape(-1)
        counts = np.bincount(flat, minlength=module.num_embeddings)[:, None]
        scatter = np.zeros((module.num_embeddings, g.shape[-1]))
        np.add.at(scatter, flat, e_g.reshape(-1, g.shape[-1]))
        summed = np.zeros_like(scatter)
        np.add.at(summed, flat, ag.reshape(-1, g.shape[-1]))
        return {"weight": scatter + (counts + 1) * summed}
    rows = tuple(range(g.ndim - 1))
    n = int(np.prod(g.shape[:-1]))
    if isinstance(module, LayerNorm):
        _, s_dw, _ = gb.layer_norm_backward_scales(x, module.weight.data, g)
        xhat, rstd = gb.layer_norm_values(x)
        ax = np.abs(xhat)
        x_extra = rstd * (e_x + e_x.mean(-1, keepdims=True)) + ax * rstd * (
            ax * e_x).mean(-1, keepdims=True)
        return {"weight": s_dw + (e_g * ax + ag * x_extra).sum(axis=rows),
                "bias": e_g.sum(axis=rows) + (n + 1) * ag.sum(axis=rows)}
    x2 = np.abs(x.astype(np.float64)).reshape(n, -1)
    g2, eg2, ex2 = ag.reshape(n, -1), e_g.reshape(n, -1), e_x.reshape(n, -1)
    out = {"weight": eg2.T @ x2 + g2.T @ ex2 + (n + 1) * (g2.T @ x2)}
    if module.bias is not None:  # type: ignore[attr-defined]
        out["bias"] = eg2.sum(axis=0) + (n + 1) * g2.sum(axis=0)
    return out


def grad_pairs(config: GPTConfig, dtype: type, batch: int, seq_len: int, seed: int,
               device: str = "cpu") -> tuple[list[Pair], set[str], set[str]]:
    """gpt.grads for every parameter of an untied model along one end-to-end forward and
    backward: (pairs, parameter names compared, all parameter names)."""
    ref, twin = make_pair(config, dtype, seed % 1000, device)
    idx, targets = tokens(config, batch, seq_len, seed)
    run = run_torch(twin, idx, targets, device=device, layerwise=True)
    seen, gouts = record_ref(ref, idx, targets, run.keeps, backward=True)
    eps = float(np.finfo(dtype).eps)
    pairs: list[Pair] = []
    compared: set[str] = set()
    for path, m in ref.named_modules():
        if path not in gouts:
            continue
        t_ins, _, _, t_g = run.layers[path]
        x = t_ins[0]
        e_x = (np.zeros(x.shape) if isinstance(m, Embedding) else
               np.abs(seen[path][0][0].astype(np.float64) - x.astype(np.float64)) / eps)
        e_g = np.abs(gouts[path].astype(np.float64) - t_g.astype(np.float64)) / eps
        for key, scale in _param_grad_scales(m, x, e_x, t_g, e_g).items():
            name = f"{path}.{key}"
            pairs.append(("gpt.grads", name, m._params[key].grad, run.grads[name], scale))
            compared.add(name)
    return pairs, compared, {name for name, _ in ref.named_parameters()}
