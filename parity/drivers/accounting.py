"""Predicting and measuring one training step in both trees: the prediction sheet (formulas
only), one step of the MLP measured in torch (StepMeter: FLOPs by phase, saved bytes by
region, the training state) and in the reference (its arrays, its tape, its recompute
counters), and each gap between a measurement and the sheet with the term that explains it.

Models: "mlp" (the compact model, predicted and measured here) and "gpt" (the GPT-2 style
decoder of reference/flops.py: its formula sheet here; the exact activation rows and the
measured step of the compact transformer in parity/drivers/accounting_gpt.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from reference import accounting as racc
from reference import flops as rflops

MODELS = ("mlp", "gpt")
# the formula's optimizer -> (torch.optim / reference.optim class, keyword arguments)
OPTIMIZERS = {"sgd": ("SGD", {"lr": 1e-2}), "sgd_momentum": ("SGD", {"lr": 1e-2, "momentum": 0.9}),
              "adam": ("Adam", {"lr": 1e-3}), "adamw": ("AdamW", {"lr": 1e-3,
                                                                  "weight_decay": 1e-2})}
PRECISIONS = ("fp32", "bf16", "fp16", "bf16_mixed", "fp16_mixed")  # project's, then formula's
EXACT_ROWS = "gpt_activation_bytes: parity/drivers/accounting_gpt.py's gpt_sheet"


@dataclass(frozen=True)
class MLPCase:
    """One step of make_mlp(sizes): the project's default TrainConfig model unless told."""

    sizes: tuple[int, ...] = (8, 32, 32, 3)
    batch: int = 16
    activation: str = "tanh"
    dropout: float = 0.0
    precision: str = "fp32"
    optimizer: str = "adamw"
    recompute: str = "none"
    early_stop: bool = True
    seed: int = 0

    @property
    def n_params(self) -> int:
        return racc.mlp_param_count(self.sizes)


@dataclass(frozen=True)
class GPTCase:
    """One step of the decoder (GPT-2 small's shapes unless told)."""

    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    seq_len: int = 1024
    vocab: int = 50257
    batch: int = 8
    d_ff: int | None = None
    bias: bool = True
    tie_weights: bool = False
    dropout: float = 0.0
    precision: str = "bf16"
    optimizer: str = "adamw"
    recompute: str = "none"
    block_size: int | None = None  # the position table's rows; None: seq_len

    def shape(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in ("n_layer", "d_model", "n_head", "seq_len", "vocab",
                                              "batch", "d_ff")}

    @property
    def n_params(self) -> int:
        return rflops.gpt_param_count(self.n_layer, self.d_model, self.vocab,
                                      self.block_size or self.seq_len, self.d_ff, self.bias,
                                      self.tie_weights)


@dataclass
class Row:
    """One line of the sheet: a predicted integer, the formula it comes from, and what each
    tree measured (filled by `reconcile`)."""

    section: str  # "memory" or "flops"
    name: str
    predicted: int | None
    formula: str
    measured: dict[str, int | None] = field(default_factory=dict)
    terms: dict[str, str] = field(default_factory=dict)  # tree -> the term naming its gap

    def gap(self, tree: str) -> int | None:
        m = self.measured.get(tree)
        return None if m is None or self.predicted is None else m - self.predicted


# the state rows and the FLOP phases, in the order the tests compare them
STATE = ("weights", "grads", "master", "grad_buffer", "optimizer_state", "optimizer_step")
PHASES = ("forward", "backward", "recompute", "optimizer")


def predicted(rows: list[Row], names: tuple[str, ...]) -> np.ndarray:
    """The rows' predicted bytes (or FLOPs) of `names`, in that order, as int64."""
    by_name = {r.name: r.predicted for r in rows}
    return np.array([by_name[n] for n in names], dtype=np.int64)


def measured(state: dict[str, int], names: tuple[str, ...]) -> np.ndarray:
    """A measurement's entries of `names`, in that order (0 for one it lacks), as int64."""
    return np.array([state.get(n, 0) for n in names], dtype=np.int64)


def _memory_rows(n_params: int, n_tensors: int, optimizer: str, precision: str,
                 master: bool) -> list[Row]:
    args = racc.memory_arguments(precision) if precision in racc.PROJECT_PRECISIONS else {
        "precision": precision, "master_weights": master}
    mem = racc.training_memory(n_params, optimizer=optimizer, **args)  # type: ignore[arg-type]
    where = f"training_memory({args['precision']!r}, master={args['master_weights']})"
    rows = [Row("memory", k, mem[k], where) for k in
            ("weights", "grads", "master", "grad_buffer", "optimizer_state")]
    rows.append(Row("memory", "optimizer_step", racc.optimizer_step_bytes(optimizer, n_tensors),
                    "Adam's step: 4 bytes per parameter tensor"))
    return rows


def predict_mlp(case: MLPCase, device: str = "cpu") -> list[Row]:
    """The sheet of one MLP step: training state, held activations, FLOPs by phase (on CUDA
    the fused dropout keeps a 1-byte mask)."""
    rows = _memory_rows(case.n_params, racc.mlp_param_tensors(case.sizes), case.optimizer,
                        case.precision, master=False)
    kw = {"activation": case.activation, "dropout": case.dropout}
    loss_size = 4  # float32: the data's dtype, and autocast's fp32 list for the loss
    rows += [
        Row("memory", "activations: model",
            racc.mlp_activation_bytes(case.sizes, case.batch, precision=case.precision,
                                      recompute=case.recompute, device=device.split(":")[0],
                                      **kw), "mlp_activation_bytes"),
        Row("memory", "activations: loss",
            racc.held_bytes(racc.loss_saved(case.batch, case.sizes[-1], itemsize=loss_size)),
            "loss_saved (cross-entropy)"),
        Row("memory", "activations: GradScaler", 4 if case.precision == "fp16" else 0,
            "fp16: loss * scale saves the float32 scale"),
    ]
    phases = rflops.mlp_flops(case.sizes, case.batch, recompute=case.recompute,
                              early_stop=case.early_stop, **kw)
    rows += [Row("flops", k, v, "mlp_flops") for k, v in phases.items() if k != "total"]
    return rows


def predict_gpt(case: GPTCase) -> list[Row]:
    """The decoder's formula sheet: training state, Korthikanti's activations, FLOPs."""
    rflops.check_gpt(**case.shape(), recompute=case.recompute, dropout=case.dropout)  # type: ignore[arg-type]
    tensors = rflops.gpt_param_tensors(case.n_layer, case.bias, case.tie_weights)
    rows = _memory_rows(case.n_params, tensors, case.optimizer, case.precision,
                        master=case.precision.endswith("_mixed"))
    korthikanti = {"none": "none", "full": "full", "full_early_stop": "full"}[case.recompute]
    rows += [
        Row("memory", "activations: Korthikanti",
            racc.activation_bytes(seq_len=case.seq_len, batch=case.batch, hidden=case.d_model,
                                  n_head=case.n_head, n_layer=case.n_layer,
                                  recompute=korthikanti),
            f"activation_bytes(recompute={korthikanti!r}): 16-bit, 1-byte masks"),
        Row("memory", "activations: this block, exact", None, EXACT_ROWS),
    ]
    phases = rflops.transformer_phase_flops(**case.shape(), recompute=case.recompute,  # type: ignore[arg-type]
                                            dropout=case.dropout)
    rows += [Row("flops", k, v, "transformer_phase_flops") for k, v in phases.items()
             if k != "total"]
    return rows


def totals(rows: list[Row], n_params: int) -> dict[str, int]:
    """memory, its training-state part, FLOPs, and the per-parameter bytes (training_memory's
    rows over n_params: exact, the per-tensor step excluded). Korthikanti's row counts only
    where no exact activation rows exist (the formula's *_mixed precisions)."""
    exact = any(r.name == "activations: model" for r in rows)
    mem = [r for r in rows if r.section == "memory" and r.predicted is not None
           and not (exact and r.name == "activations: Korthikanti")]  # a comparison then
    per_param = sum(r.predicted for r in mem if r.formula.startswith("training_memory"))  # type: ignore[misc]
    return {"memory": sum(r.predicted for r in mem),  # type: ignore[misc]
            "state": sum(r.predicted for r in mem  # type: ignore[misc]
                         if not r.name.startswith("activations")),
            "flops": sum(r.predicted for r in rows if r.section == "flops"),  # type: ignore[misc]
            "bytes_per_param": per_param // n_params}


# ---------------------------------------------------------------- one step, measured
def _data(case: MLPCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((case.batch, case.sizes[0])).astype(np.float32)
    return x, rng.integers(0, case.sizes[-1], case.batch).astype(np.int64)


def torch_step(case: MLPCase, device: str = "cpu") -> dict[str, object]:
    """One torch_impl.train.train_step under StepMeter: state bytes, held bytes by region,
    FLOPs by phase (and CUDA memory by phase on CUDA)."""
    from torch_impl import accounting as tacc
    from torch_impl import loss_scaling, recompute, train
    from torch_impl.nn import make_mlp

    # built on the CPU, then moved: make_mlp draws from a CPU generator
    model = make_mlp(case.sizes, case.activation, case.dropout,
                     generator=torch.Generator().manual_seed(case.seed)).to(device)
    cls, kw = OPTIMIZERS[case.optimizer]
    optimizer = getattr(torch.optim, cls)(model.parameters(), **kw)
    loss_fn = torch.nn.CrossEntropyLoss()
    scaler = loss_scaling.make_scaler(case.precision, device)
    x, y = (torch.from_numpy(a).to(device) for a in _data(case))
    schedule = None if case.recompute == "none" else recompute.parse_schedule(case.recompute,
                                                                             len(model))
    early = contextlib.nullcontext() if case.early_stop else \
        torch.utils.checkpoint.set_checkpoint_early_stop(False)
    with torch.random.fork_rng(devices=[]), early:
        torch.manual_seed(case.seed)
        with tacc.StepMeter(model, loss_fn=loss_fn, optimizer=optimizer, device=device) as m:
            result = train.train_step(model, loss_fn, optimizer, scaler, x, y,
                                      precision=case.precision, schedule=schedule)
    return {"state": tacc.state_bytes(model, optimizer), "flops": m.flops.as_dict(),
            "held": {r: m.held(r) for r in ("model", "loss", "other")}, "cuda": m.cuda,
            "skipped": result.skipped}


def torch_low_precision_weights_step(case: MLPCase, dtype: str, master: bool
                                     ) -> dict[str, int]:
    """One step of the MLP held in bf16/fp16 (no autocast): the training state the formula's
    'bf16_mixed'/'fp16_mixed' describe. With `master`, the optimizer steps float32 copies
    (their gradient a transient float32 cast of the low-precision one, freed after the step,
    as ZeRO counts it) and the copies are written back; without, it steps the parameters."""
    from torch_impl import accounting as tacc
    from torch_impl.amp import PRECISIONS
    from torch_impl.nn import make_mlp

    lp = PRECISIONS[dtype]  # "bf16" or "fp16"
    model = make_mlp(case.sizes, case.activation, case.dropout,
                     generator=torch.Generator().manual_seed(case.seed)).to(lp)
    params = list(model.parameters())
    copies = [p.detach().float() for p in params] if master else []
    cls, kw = OPTIMIZERS[case.optimizer]
    optimizer = getattr(torch.optim, cls)(copies or params, **kw)
    x, y = (torch.from_numpy(a) for a in _data(case))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        torch.nn.functional.cross_entropy(model(x.to(lp)).float(), y).backward()
    pairs = list(zip(copies, params, strict=True)) if master else []
    for copy, p in pairs:
        copy.grad = p.grad.float()  # type: ignore[union-attr]
    optimizer.step()
    with torch.no_grad():
        for copy, p in pairs:
            p.copy_(copy)
            copy.grad = None
    return tacc.state_bytes(model, optimizer, master=copies)


def torch_meta_flops(case: MLPCase) -> dict[str, int]:
    """FlopCounterMode over one forward + backward of the MLP on the meta device: shapes only,
    nothing allocated (no optimizer: its step counts 0 FLOPs anyway)."""
    from torch_impl import accounting as tacc
    from torch_impl import recompute
    from torch_impl.nn import make_mlp

    model = make_mlp(case.sizes, case.activation, case.dropout,
                     generator=torch.Generator(), device="meta")
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.empty(case.batch, case.sizes[0], device="meta")
    y = torch.zeros(case.batch, dtype=torch.int64, device="meta")
    early = contextlib.nullcontext() if case.early_stop else \
        torch.utils.checkpoint.set_checkpoint_early_stop(False)
    with early, tacc.StepMeter(model, loss_fn=loss_fn) as m:
        out = recompute.forward_with_schedule(model, x, recompute.parse_schedule(
            case.recompute, len(model)))
        loss_fn(out, y).backward()
    return m.flops.as_dict()


def held_forward(case: MLPCase, dtype: str = "float32") -> tuple[int, int]:
    """(torch, reference): distinct bytes held after one forward of the model alone under
    the schedule, in float32 or float64, no autocast."""
    from reference import recompute as rrc
    from reference.nn import make_mlp as ref_mlp
    from torch_impl import accounting as tacc
    from torch_impl import recompute
    from torch_impl.nn import make_mlp

    x, _ = _data(case)
    model = make_mlp(case.sizes, case.activation, case.dropout, generator=torch.Generator(),
                     dtype=getattr(torch, dtype))
    with torch.random.fork_rng(devices=[]), tacc.StepMeter(model) as meter:
        recompute.forward_with_schedule(model, torch.from_numpy(x.astype(dtype)),
                                        recompute.parse_schedule(case.recompute, len(model)))
    mine = ref_mlp(case.sizes, case.activation, case.dropout, rng=np.random.default_rng(0),
                   dtype=getattr(np, dtype))
    run = rrc.forward_with_schedule(mine, x.astype(dtype), case.recompute)
    return meter.held("model"), run.held_bytes


def reference_step(case: MLPCase) -> dict[str, object]:
    """The reference: state bytes after its train_step (its own optimizer arrays), and its
    tape after a forward of the same batch under the schedule and the case's autocast (2-byte
    lp arrays where torch holds lp tensors), with the GEMMs its counters saw
    (reference.accounting.run_flops)."""
    from reference import amp, loss_scaling, optim, recompute, train
    from reference.nn import CrossEntropyLoss, make_mlp

    def build() -> tuple[object, object]:
        return make_mlp(case.sizes, case.activation, case.dropout,
                        rng=np.random.default_rng(case.seed)), CrossEntropyLoss()

    x, y = _data(case)
    model, loss_fn = build()
    cls, kw = OPTIMIZERS[case.optimizer]
    optimizer = getattr(optim, cls)(model.parameters(), **kw)  # type: ignore[attr-defined]
    with np.errstate(over="ignore", invalid="ignore"):
        train.train_step(model, loss_fn, optimizer, loss_scaling.make_scaler(case.precision),
                         x, y, precision=case.precision)  # type: ignore[arg-type]
    out: dict[str, object] = {"state": racc.state_bytes(model, optimizer)}  # type: ignore[arg-type]
    model, loss_fn = build()
    with amp.autocast(amp.autocast_dtype(case.precision)):
        run = recompute.forward_with_schedule(model, x, case.recompute,  # type: ignore[arg-type]
                                              early_stop=case.early_stop)
        loss_fn(run.output, y)  # type: ignore[operator]
    out["held"] = {"model": run.held_bytes, "loss": racc.tape_bytes([loss_fn]),  # type: ignore[list-item]
                   "other": 0}
    out["tape_forward"] = racc.tape_flops(model) if case.recompute == "none" else None  # type: ignore[arg-type]
    run.backward(loss_fn.backward())  # type: ignore[attr-defined]
    out["flops"] = racc.run_flops(run)
    return out


# ---------------------------------------------------------------- gaps and their names
def first_dx(case: MLPCase) -> int:
    """The first Linear's dx GEMM: the reference computes it, torch skips it for data."""
    return 2 * case.batch * case.sizes[0] * case.sizes[1]


def first_weight_cast(case: MLPCase) -> int:
    """Under autocast, the bytes of the first Linear's lp weight cast when that Linear runs
    outside every checkpoint: the reference's tape keeps it for the dx it always computes;
    torch's addmm saves no mat2 when its input needs no grad (0 in fp32, where the weight
    is the parameter itself and never on the tape)."""
    from reference.recompute import parse_schedule

    if case.precision == "fp32":
        return 0
    n = len(rflops.mlp_layers(case.sizes, case.activation, case.dropout))
    return 2 * case.sizes[0] * case.sizes[1] if parse_schedule(case.recompute, n).plan[0] == 0 \
        else 0


def scaler_saved(case: MLPCase) -> int:
    """torch's fp16 `loss * scale` saves the 0-dim float32 scale; the reference scales the
    loss gradient instead (4 bytes in fp16, else 0)."""
    return 4 if case.precision == "fp16" else 0


def reconcile(rows: list[Row], case: MLPCase, measured_torch: dict, measured_ref: dict) -> None:
    """Fill each row's measurements and name every gap's term (UNEXPLAINED if none fits)."""
    for tree, m in (("torch", measured_torch), ("reference", measured_ref)):
        state, held, fl = m.get("state", {}), m.get("held"), m.get("flops")
        named: dict[str, tuple[int, str]] = {}
        if tree == "reference" and fl is not None:
            named = {"backward": (first_dx(case), "the reference computes the first dx"),
                     "recompute": (fl["cut"] if case.early_stop else 0,
                                   "early stop: torch cuts the last Linear"),
                     "activations: model": (first_weight_cast(case), "the reference keeps "
                                            "the first Linear's lp weight for its dx"),
                     "activations: loss": (-4, "nll_loss total_weight: torch only"),
                     "activations: GradScaler": (-scaler_saved(case),
                                                 "torch's loss*scale saves the scale")}
        for r in rows:
            if r.section == "flops":
                value = None if fl is None else fl.get(r.name, 0)
            elif r.name.startswith("activations"):
                key = {"activations: model": "model", "activations: loss": "loss",
                       "activations: GradScaler": "other"}[r.name]
                value = None if held is None else held[key]
            else:
                value = state.get(r.name, 0)
            r.measured[tree] = value
            gap = r.gap(tree)
            if gap:
                expected, term = named.get(r.name, (None, ""))
                r.terms[tree] = term if gap == expected else "UNEXPLAINED"


def as_json(model: str, case: MLPCase | GPTCase, rows: list[Row]) -> dict[str, object]:
    return {"model": model, "config": asdict(case), "n_params": case.n_params,
            "rows": [asdict(r) for r in rows], "totals": totals(rows, case.n_params)}
