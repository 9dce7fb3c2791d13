"""Quick checks of the loss_scaling claims for `python -m parity report`, the drivers that
parity/test_loss_scaling.py shares, and the docs pictures (scale trajectory, gradient
exponents against the float16 range)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from parity.compare import measure
from parity.drivers.optim import FUSED
from parity.report import Observation, check, picture
from parity.tolerances import claim
from reference import amp as ramp
from reference import loss_scaling as rls
from reference import nn as rnn
from reference import optim as ropt
from reference import train as rtrain
from reference.nn import Parameter
from torch_impl import loss_scaling as tls
from torch_impl import nn as tnn
from torch_impl import train as ttrain

DOCS = Path(__file__).resolve().parents[2] / "docs"


# -- scale update and unscale, one call each
def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """Positive finite float32 scales: random bit patterns (subnormals to near max)."""
    bits = rng.integers(1, 0x7F800000, size=n, dtype=np.uint32)
    return bits.view(np.float32)


def update_pair(scale: float, tracker: int, found_inf: float, growth_factor: float,
                backoff_factor: float, growth_interval: int) -> tuple[np.ndarray, np.ndarray]:
    """(reference, torch) (scale, tracker) after one update from the same state."""
    ref = rls.GradScaler(scale, growth_factor, backoff_factor, growth_interval)
    ref.scale(np.float32(1.0))
    assert ref._growth_tracker is not None
    ref._growth_tracker[...] = tracker
    ref._update_scale_(np.array(found_inf, dtype=np.float32))
    t_scale = torch.full((), scale, dtype=torch.float32)
    t_tracker = torch.full((), tracker, dtype=torch.int32)
    torch._amp_update_scale_(t_scale, t_tracker, torch.full((), found_inf), growth_factor,
                             backoff_factor, growth_interval)
    ours = np.array([ref.get_scale()], dtype=np.float32), np.array([ref._get_growth_tracker()])
    theirs = t_scale.reshape(1).numpy(), t_tracker.reshape(1).numpy().astype(np.int64)
    return (np.concatenate([ours[0].view(np.int32).astype(np.int64), ours[1]]),
            np.concatenate([theirs[0].view(np.int32).astype(np.int64), theirs[1]]))


def unscale_pair(grads: list[np.ndarray], scale: float
                 ) -> tuple[list[np.ndarray], list[np.ndarray], float, float]:
    """Unscale the same gradients (float16/32/64 arrays) on both sides: the kernel's path
    (float16 gradients are refused by unscale_ but handled by the kernel, allow_fp16)."""
    ref = rls.GradScaler(init_scale=scale)
    ref.scale(np.float32(1.0))
    params = [Parameter(np.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.copy()
    opt = ropt.SGD(params, lr=0.0)
    found_ref = float(ref._unscale_grads_(opt, ref._inv_scale(), allow_fp16=True))
    t_grads = [torch.from_numpy(g.copy()) for g in grads]
    inv = torch.full((), scale, dtype=torch.float32).double().reciprocal().float()
    found = torch.zeros(())
    for dtype in {g.dtype for g in t_grads}:
        torch._amp_foreach_non_finite_check_and_unscale_(
            [g for g in t_grads if g.dtype == dtype], found, inv)
    return [p.grad for p in params], [g.numpy() for g in t_grads], found_ref, float(found)


def special_grads(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Gradients across magnitudes, with +inf, -inf or NaN planted at random."""
    mag = {np.float16: 24, np.float32: 140, np.float64: 300}[dtype]
    with np.errstate(over="ignore"):
        g = (rng.standard_normal(shape) * 2.0 ** rng.integers(-mag, mag // 2 + 1, shape)
             ).astype(dtype)
    kind = rng.integers(0, 5)
    if kind < 3 and g.size:
        g.reshape(-1)[rng.integers(g.size)] = (np.inf, -np.inf, np.nan)[kind]
    return g


# -- the compact model, trained in both implementations
def regression_batch(rng: np.random.Generator, n: int = 64
                     ) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, 1)^(n, 8), y = tanh(x w) for a fixed w: a task the model learns in 60 steps."""
    w = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(8, 1)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, np.tanh(x @ w).astype(np.float32)


def models(sizes: tuple[int, ...] = (8, 32, 32, 1), seed: int = 1
           ) -> tuple[rnn.Sequential, torch.nn.Sequential]:
    """The same compact model twice (reference weights copied into torch)."""
    ref = rnn.make_mlp(sizes, "gelu", rng=np.random.default_rng(seed))
    tm = tnn.make_mlp(sizes, "gelu", generator=torch.Generator().manual_seed(seed))
    tm.load_state_dict(tnn.state_dict_to_torch(ref.state_dict()))
    return ref, tm


def train_runs(precision: str, steps: int = 60, seed: int = 2, *, lr: float = 0.1,
               init_scale: float = 2.0**16, growth_interval: int = 10,
               max_grad_norm: float | None = 1.0, fault: str | None = None) -> dict[str, Any]:
    """train_step `steps` times in both implementations on the same batches."""
    ref, tm = models()
    ro = ropt.SGD(ref.parameters(), lr=lr, fma=FUSED)
    to = torch.optim.SGD(tm.parameters(), lr=lr)
    kwargs = {"init_scale": init_scale, "growth_interval": growth_interval}
    rs = rls.make_scaler(precision, **kwargs)
    ts = tls.make_scaler(precision, **kwargs)
    if fault == "fp16_without_scaler":
        rs, ts = rls.make_scaler("fp32"), tls.make_scaler("fp32")
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"ref": [], "torch": []}
    for _ in range(steps):
        x, y = regression_batch(rng)
        out["ref"].append(rtrain.train_step(ref, rnn.MSELoss(), ro, rs, x, y, precision=precision,
                                         max_grad_norm=max_grad_norm, fault=fault))
        out["torch"].append(ttrain.train_step(tm, torch.nn.MSELoss(), to, ts, torch.from_numpy(x),
                                           torch.from_numpy(y), precision=precision,
                                           max_grad_norm=max_grad_norm, fault=fault))
    out["params"] = [(name, p.data, tp.detach().numpy()) for (name, p), tp
                     in zip(ref.named_parameters(), tm.parameters(), strict=True)]
    return out


def loss_reduction(results: list[Any], k: int = 5) -> float:
    """1 - mean(last k losses) / mean(first k losses)."""
    losses = np.array([r.loss for r in results])
    return float(1.0 - losses[-k:].mean() / losses[:k].mean())


# -- fault 1: float16 without scaling
def underflow_models(seed: int = 1) -> tuple[rnn.Sequential, torch.nn.Sequential]:
    """A compact model whose output layer starts small (weights * 2^-10, as small-init output
    layers do): the gradients reaching the earlier layers are ~2^-10 smaller."""
    ref, tm = models((16, 64, 64, 4), seed)
    ref[4].weight.data *= np.float32(2.0**-10)
    tm.load_state_dict(tnn.state_dict_to_torch(ref.state_dict()))
    return ref, tm


def underflow_grads(scale: float, dtype: str = "float16", seed: int = 3
                    ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, reference grad, torch grad) of one autocast backward of S * loss, unscaled."""
    ref, tm = underflow_models()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    y = (rng.standard_normal((256, 4)) * 0.1).astype(np.float32)
    amp_model, loss_fn = ramp.Autocast(ref, dtype), rnn.MSELoss()
    loss_fn(amp_model(x), y)
    amp_model.backward(loss_fn.backward(np.float32(scale)))
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        loss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y))
    (loss * torch.tensor(scale, dtype=torch.float32)).backward()
    return [(name, p.grad / np.float32(scale), tp.grad.numpy() / np.float32(scale))
            for (name, p), tp in zip(ref.named_parameters(), tm.parameters(), strict=True)]


def underflow_fractions(scale: float, dtype: str = "float16") -> dict[str, tuple[float, float]]:
    """Per parameter: (reference, torch) fraction of gradient elements that are exactly 0."""
    return {name: (float(np.mean(a == 0)), float(np.mean(b == 0)))
            for name, a, b in underflow_grads(scale, dtype)}


@check("loss_scaling.update_rule")
def _() -> Observation:
    rng = np.random.default_rng(0)
    c, worst, n = claim("loss_scaling.update_rule"), 0.0, 0
    for scale in random_scales(rng, 300):
        gi = int(rng.integers(1, 4))
        a, b = update_pair(float(scale), int(rng.integers(0, gi)), float(rng.integers(0, 2)),
                           float(rng.uniform(1.0001, 8)), float(rng.uniform(0.001, 0.9999)), gi)
        worst, n = max(worst, measure(c, a, b)), n + 2
    return Observation(worst, n, "random float32 scales, factors and trackers")


@check("loss_scaling.unscale")
def _() -> Observation:
    rng = np.random.default_rng(1)
    c, worst, n = claim("loss_scaling.unscale"), 0.0, 0
    for scale in random_scales(rng, 40):
        grads = [special_grads(rng, (33,), dt) for dt in (np.float32, np.float64, np.float16)]
        a, b, fa, fb = unscale_pair(grads, float(scale))
        worst = max([worst, float(fa != fb)] + [measure(c, x, y) for x, y in zip(a, b,
                                                                                 strict=True)])
        n += sum(g.size for g in grads)
    return Observation(worst, n, "float16/32/64 gradients with inf/NaN planted")


class ScalerPair:
    """A reference and a torch GradScaler, each with SGD over the same parameters."""

    def __init__(self, hyper: dict[str, Any], shapes: list[tuple[int, ...]], seed: int) -> None:
        rng = np.random.default_rng(seed)
        init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        self.hyper = hyper
        self.ref_params = [Parameter(x.copy()) for x in init]
        self.torch_params = [torch.nn.Parameter(torch.from_numpy(x.copy())) for x in init]
        self.ref_opt = ropt.SGD(self.ref_params, lr=0.1, momentum=0.5, fma=FUSED)
        self.torch_opt = torch.optim.SGD(self.torch_params, lr=0.1, momentum=0.5)
        self.ref = rls.GradScaler(**hyper)
        self.torch = torch.amp.GradScaler("cpu", **hyper)
        self.skips: tuple[bool, bool] = (False, False)

    def iterate(self, grads: list[np.ndarray], explicit_unscale: bool) -> None:
        """scale (a 1.0 loss), set the gradients, [unscale_], step, update: both sides."""
        self.ref.scale(np.float32(1.0))
        self.torch.scale(torch.tensor(1.0))
        for p, tp, g in zip(self.ref_params, self.torch_params, grads, strict=True):
            p.grad, tp.grad = g.copy(), torch.from_numpy(g.copy())
        if explicit_unscale:
            self.ref.unscale_(self.ref_opt)
            self.torch.unscale_(self.torch_opt)
        self.ref.step(self.ref_opt)
        self.torch.step(self.torch_opt)
        self.skips = (rls.step_skipped(self.ref, self.ref_opt),
                      tls.step_skipped(self.torch, self.torch_opt))
        self.ref.update()
        self.torch.update()

    def save_load(self, cross: bool) -> None:
        """Rebuild both scalers from state_dicts (each from the other's when `cross`)."""
        ref_state, torch_state = self.ref.state_dict(), self.torch.state_dict()
        assert set(ref_state) == set(torch_state), (ref_state, torch_state)
        if cross:
            ref_state, torch_state = torch_state, ref_state
        self.ref = rls.GradScaler(**self.hyper)
        self.ref.load_state_dict(ref_state)
        self.torch = torch.amp.GradScaler("cpu", **self.hyper)
        self.torch.load_state_dict(torch_state)

    def compare(self) -> list[tuple[str, Any, Any]]:
        """(label, reference, torch) for scale, tracker, skip, every grad and parameter."""
        pairs: list[tuple[str, Any, Any]] = [
            ("scale", np.float32(self.ref.get_scale()), np.float32(self.torch.get_scale())),
            ("tracker", np.int64(self.ref._get_growth_tracker()),
             np.int64(self.torch._get_growth_tracker())),
            ("skipped", np.bool_(self.skips[0]), np.bool_(self.skips[1])),
        ]
        for i, (p, tp) in enumerate(zip(self.ref_params, self.torch_params, strict=True)):
            pairs.append((f"param {i}", p.data, tp.detach().numpy()))
            if p.grad is not None:
                pairs.append((f"grad {i}", p.grad, tp.grad.numpy()))
        return pairs


def run_scaler_stream(seed: int, steps: int) -> tuple[float, int]:
    """A random stream through a ScalerPair: worst loss_scaling.scaler measure, n compared."""
    rng = np.random.default_rng(seed)
    hyper = {"init_scale": float(random_scales(rng, 1)[0]),
             "growth_factor": float(rng.uniform(1.01, 4)),
             "backoff_factor": float(rng.uniform(0.05, 0.95)),
             "growth_interval": int(rng.integers(1, 4))}
    shapes = [(3,), (2, 5)]
    pair = ScalerPair(hyper, shapes, seed)
    c, worst, n = claim("loss_scaling.scaler"), 0.0, 0
    for step in range(steps):
        pair.iterate([special_grads(rng, s, np.float32) for s in shapes],
                     bool(rng.integers(0, 2)))
        if step % 7 == 3:
            pair.save_load(cross=bool(rng.integers(0, 2)))
        for _label, a, b in pair.compare():
            worst, n = max(worst, measure(c, a, b)), n + np.size(a)
    return worst, n


@check("loss_scaling.scaler")
def _() -> Observation:
    worst, n = 0.0, 0
    for seed in range(3):
        w, k = run_scaler_stream(seed=seed, steps=30)
        worst, n = max(worst, w), n + k
    return Observation(worst, n, "three 30-step streams with save/load")


@check("loss_scaling.underflow_mask")
def _() -> Observation:
    c, worst, n = claim("loss_scaling.underflow_mask"), 0.0, 0
    for _name, a, b in underflow_grads(1.0):
        worst, n = max(worst, measure(c, a == 0, b == 0)), n + a.size
    return Observation(worst, n, "fp16 without scaling, small-init output layer")


@check("loss_scaling.train")
def _() -> Observation:
    c, worst, n, notes = claim("loss_scaling.train"), 0.0, 0, []
    for precision in ("fp16", "bf16"):
        run = train_runs(precision, steps=30)
        for _name, a, b in run["params"]:
            worst, n = max(worst, measure(c, a, b)), n + a.size
        same = [(r.scale, r.skipped) for r in run["ref"]] == [
            (t.scale, t.skipped) for t in run["torch"]]
        worst = worst if same else float("inf")
        notes.append(f"{precision}: loss -{loss_reduction(run['ref']):.0%} (ref), "
                     f"-{loss_reduction(run['torch']):.0%} (torch)")
    return Observation(worst, n, "30 steps; " + "; ".join(notes))


# -- pictures
@picture("loss_scaling_trajectory.png")
def draw_trajectory(path: Path) -> None:
    """The scale over a float16 run with overflow events marked (both implementations)."""
    import matplotlib.pyplot as plt

    run = train_runs("fp16", steps=120, init_scale=2.0**24, growth_interval=8)
    ref_scales = [r.scale for r in run["ref"]]
    torch_scales = [t.scale for t in run["torch"]]
    skips = [i for i, r in enumerate(run["ref"]) if r.skipped]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.step(range(len(ref_scales)), ref_scales, where="post", label="reference")
    ax.step(range(len(torch_scales)), torch_scales, where="post", linestyle="--",
            label="torch.amp.GradScaler")
    ax.scatter(skips, [ref_scales[i] for i in skips], color="red", zorder=3,
               label="overflow: step skipped, scale backed off")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale S")
    ax.set_title("Dynamic loss scale (fp16, init 2^24, growth_interval 8)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@picture("loss_scaling_exponents.png")
def draw_exponents(path: Path) -> None:
    """Histogram of log2|g| of the compact model's float32 gradients against fp16's range."""
    import matplotlib.pyplot as plt

    ref, _ = underflow_models()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    y = (rng.standard_normal((256, 4)) * 0.1).astype(np.float32)
    loss_fn = rnn.MSELoss()
    loss_fn(ref(x), y)
    ref.backward(loss_fn.backward())
    g = np.concatenate([p.grad.ravel() for p in ref.parameters()])
    e = np.log2(np.abs(g[g != 0]))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bins = np.arange(np.floor(e.min()) - 1, 18)
    ax.hist(e, bins=bins, color="grey", label="float32 gradients (S = 1)")
    ax.hist(e + 16, bins=np.arange(bins[0], 34), histtype="step", color="C0",
            label="the same, scaled by S = 2^16")
    ax.axvspan(bins[0], -25, color="red", alpha=0.15, label="fp16: rounds to 0 (< 2^-25)")
    ax.axvspan(-25, -14, color="orange", alpha=0.15, label="fp16 subnormal (2^-24 .. 2^-14)")
    ax.axvline(16, color="black", linestyle=":", label="fp16 max 65504 (~2^16)")
    ax.set_xlabel("log2 |g|")
    ax.set_ylabel("elements")
    ax.set_title("Gradient exponents of the compact model (small-init output layer)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_docs_pictures() -> list[Path]:
    """Draw this topic's pictures into docs/img (python -m parity.checks.loss_scaling)."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [DOCS / "img" / "loss_scaling_trajectory.png",
             DOCS / "img" / "loss_scaling_exponents.png"]
    draw_trajectory(paths[0])
    draw_exponents(paths[1])
    return paths


if __name__ == "__main__":
    print(write_docs_pictures())
