"""A profiled training run in either tree: the prediction sheet (written before anything is
measured), the steps timed phase by phase, the bytes at every boundary, and each gap between
prediction and measurement beside the term that explains it.

Order (the tests hold it): probe the machine (a matmul's FLOP/s, a copy's bytes/s: the rates
the prediction needs, nothing of the model) -> predict and WRITE DIR/predictions.json and
predictions.md -> only then build the run and measure. NOTE [ Predicting a phase ] and NOTE
[ Phase boundaries ] (reference/profile.py) define the sheet; NOTE [ Naming a gap ] below the
comparison.

Models: "mlp" (TrainConfig's sizes) and "gpt" (train --model gpt's transformer: its half of
the sheet is parity/drivers/profile_gpt.py); each function below that depends on the model
asks `case.model`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parity.drivers import accounting as acc
from parity.drivers import profile_gpt as pgpt
from reference import accounting as racc
from reference import flops as rflops
from reference import profile as rprof
from reference.recompute import Segment, parse_schedule
from reference.train import TrainConfig

MODELS = ("mlp", "gpt")
IMPLS = ("reference", "torch")
OPTIMIZER_NAMES = {"SGD": "sgd_momentum", "Adam": "adam", "AdamW": "adamw"}  # train -> formula
BOUNDARIES = ("start", *rprof.PHASES)
# a machine of unit rates: for the parts of the sheet that do not depend on the machine
NO_MACHINE = {"device": "none", "matmul_flops_per_s": 1.0, "copy_bytes_per_s": 1.0,
              "h2d_bytes_per_s": None}
CPU_NULL = ("CPU: kernels run synchronously on the calling thread, so moving a sync cannot "
            "move time between phases; the three timings differ only by noise")


@dataclass(frozen=True)
class ProfileCase:
    """What one profile runs: the tree, the model's TrainConfig fields, the schedule of the
    profiler (wait, warmup, active; the steps after the window run without it), and how many
    steps the extra measurements take (`repeats`: the one-row run, each honest-timing variant)."""

    impl: str = "torch"
    model: str = "mlp"
    device: str = "cpu"
    precision: str = "fp32"
    recompute: str = "none"
    steps: int = 30
    wait: int = 2
    warmup: int = 2
    active: int = 6
    repeats: int = 5
    probe: int = 256  # the matmul probe's side n
    sizes: tuple[int, ...] = (8, 32, 32, 3)
    batch: int = 16
    activation: str = "tanh"
    dropout: float = 0.0
    optimizer: str = "AdamW"
    threads: int = 1  # torch's CPU threads (torch.set_num_threads) while probing and measuring

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.impl == "reference" and self.device != "cpu":
            raise ValueError(f"--device {self.device}: the reference runs in NumPy on the CPU; "
                             "accepted with --impl reference: cpu")
        if min(self.wait, self.warmup) < 0 or min(self.active, self.repeats) < 1:
            raise ValueError("wait and warmup must be >= 0, active and repeats >= 1")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.steps < self.wait + self.warmup + self.active:
            raise ValueError(f"--steps {self.steps} is fewer than wait + warmup + active = "
                             f"{self.wait} + {self.warmup} + {self.active}: the profiler's "
                             "window would never reach its active steps")
        self.train_config()  # a bad precision, recompute spec or size is refused now
        if self.model == "gpt":
            pgpt.check_recompute(self.recompute)
            self.accountant()  # what the accountant does not model is refused now (CUDA autocast)
            return
        if not (1 <= self.sizes[0] <= 64 and 2 <= self.sizes[-1] <= 16):
            raise ValueError(f"sizes {self.sizes}: the synthetic task (data.make_task) has "
                             "1 to 64 input features and 2 to 16 classes: accepted sizes "
                             "start in 1..64 and end in 2..16")
        parse_schedule(self.recompute, len(rflops.mlp_layers(self.sizes, self.activation,
                                                             self.dropout)))
        if self.impl == "reference" and self.recompute != "none" and self.precision != "fp32":
            raise ValueError(f"--impl reference: recompute with precision {self.precision!r} "
                             "is not composed in the reference; accepted: --precision fp32, "
                             "or --recompute none")

    def train_config(self, batch: int | None = None) -> TrainConfig:
        return TrainConfig(model=self.model, sizes=self.sizes, batch_size=batch or self.batch,
                           activation=self.activation, dropout=self.dropout,
                           precision=self.precision, recompute=self.recompute,
                           optimizer=self.optimizer)

    def mlp_case(self) -> acc.MLPCase:
        if self.model != "mlp":
            raise ValueError(f"mlp_case of a {self.model!r} profile")
        return acc.MLPCase(sizes=self.sizes, batch=self.batch, activation=self.activation,
                           dropout=self.dropout, precision=self.precision,
                           optimizer=OPTIMIZER_NAMES[self.optimizer], recompute=self.recompute)

    def gpt_case(self) -> acc.GPTCase:
        if self.model != "gpt":
            raise ValueError(f"gpt_case of a {self.model!r} profile")
        return pgpt.gpt_case(self.batch, self.precision, OPTIMIZER_NAMES[self.optimizer],
                             self.dropout)

    @property
    def n_param_tensors(self) -> int:
        """How many parameter tensors the optimizer steps one by one."""
        if self.model == "gpt":
            return pgpt.n_param_tensors(self.gpt_case())
        return racc.mlp_param_tensors(self.sizes)

    def batch_bytes(self) -> dict[str, int]:
        """The loop's batch: inputs x, targets y, and what the loader gathers for them."""
        if self.model == "gpt":
            return pgpt.batch_bytes(self.batch)
        x, y = self.batch * self.sizes[0] * 4, self.batch * 8  # float32 inputs, int64 labels
        return {"x": x, "y": y, "gathered": x + y + self.batch * self.sizes[-1] * 4}  # values

    def accountant(self) -> tuple[list[acc.Row], int]:
        """The accountant's rows of this step (the formula's device) and n_params."""
        device = self.device.split(":")[0]
        if self.model == "gpt":
            gc = self.gpt_case()
            return pgpt.predict_rows(gc, self.recompute, device), gc.n_params
        mc = self.mlp_case()
        return acc.predict_mlp(mc, device), mc.n_params

    @contextlib.contextmanager
    def torch_threads(self) -> Iterator[None]:
        """torch's CPU threads set to `threads` for the probes and the run, then restored (the
        reference: nothing; NumPy's BLAS threads are fixed when it loads)."""
        if self.impl != "torch":
            yield
            return
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @property
    def active_steps(self) -> range:
        return range(self.wait + self.warmup, self.wait + self.warmup + self.active)

    @property
    def unprofiled_steps(self) -> range:
        return range(self.wait + self.warmup + self.active, self.steps)


# ---------------------------------------------------------------- the prediction sheet
def probe_machine(case: ProfileCase) -> dict[str, Any]:
    """The rates the roofline needs (NOTE [ Predicting a phase ]), measured on this machine."""
    if case.impl == "reference":
        import numpy as np

        blas = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        return {"device": "CPU (NumPy)", "numpy": np.__version__, "probe_n": case.probe,
                "blas_threads": blas or "the BLAS library's default",
                "probe_dtype": "float32", "matmul_flops_per_s": rprof.matmul_rate(case.probe),
                "copy_bytes_per_s": rprof.copy_bandwidth(), "h2d_bytes_per_s": None,
                "op_s": rprof.op_overhead(),
                "sync_s": 0.0, "cublas_workspace": None}
    import torch

    from torch_impl import amp
    from torch_impl import profile as tprof

    dtype = amp.autocast_dtype(case.precision) or torch.float32
    on_cuda = case.device.startswith("cuda")
    name = torch.cuda.get_device_name(case.device) if on_cuda else "CPU"
    return {"device": name, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "probe_n": case.probe,
            "probe_dtype": str(dtype).removeprefix("torch."),
            "cublas_workspace": tprof.cublas_workspace_bytes(case.device),
            "matmul_flops_per_s": tprof.matmul_rate(case.device, dtype, case.probe),
            "copy_bytes_per_s": tprof.copy_bandwidth(case.device),
            "h2d_bytes_per_s": tprof.h2d_bandwidth(case.device),
            "op_s": tprof.op_overhead(case.device),
            "sync_s": tprof.sync_latency(case.device)}


def _held_tensors(case: acc.MLPCase, device: str) -> list[racc.Saved]:
    """The tensors held between forward and backward under the schedule: the walk of
    reference.accounting.mlp_activation_bytes, which returns only their bytes (checked)."""
    kw = {"activation": case.activation, "dropout": case.dropout}
    saved, inputs = racc.mlp_saved(case.sizes, case.batch, precision=case.precision,
                                   device=device, **kw)
    held: list[racc.Saved] = []
    for item in parse_schedule(case.recompute, len(inputs) - 1).plan:
        held += [inputs[item.start]] if isinstance(item, Segment) else \
            [e for e in saved if e.layer == item]
    assert racc.held_bytes(held) == racc.mlp_activation_bytes(
        case.sizes, case.batch, precision=case.precision, recompute=case.recompute,
        device=device, **kw)
    return held


def formula_timeline(case: ProfileCase) -> list[tuple[str, dict[str, int]]]:
    """Bytes by category at each boundary of a steady step (NOTE [ Phase boundaries ]), from
    the accountant's sheet: torch's counting (the reference's differences are named terms)."""
    device = case.device.split(":")[0]
    rows, _ = case.accountant()
    mem = {r.name: r.predicted for r in rows if r.section == "memory"}
    w, g = mem["weights"], mem["grads"]
    o = mem["optimizer_state"] + mem["optimizer_step"]
    # the GradScaler's save (fp16: S * loss saves the 0-dim S) is made and freed inside the
    # backward phase: never live at a boundary
    a = mem["activations: model"] + mem["activations: loss"]
    x, y = case.batch_bytes()["x"], case.batch_bytes()["y"]
    if case.model == "gpt":
        saved_batch = pgpt.saved_batch(case.gpt_case(), case.recompute, device, x, y)
    else:
        held = {e.tensor for e in _held_tensors(case.mlp_case(), device)} | {"target"}
        saved_batch = x * ("x" in held) + y * ("target" in held)  # the loss saves y
    at = {"start": (w, g, o, 0, 0), "data wait": (w, g, o, 0, x + y),
          "host-to-device": (w, g, o, 0, x + y), "forward": (w, 0, o, a, x + y - saved_batch),
          "backward": (w, g, o, 0, x + y), "optimizer": (w, g, o, 0, x + y)}
    return [(b, dict(zip(rprof.CATEGORIES, at[b], strict=True))) for b in BOUNDARIES
            if b in at and (b != "host-to-device" or case.impl == "torch")]


def tree_flops(case: ProfileCase) -> dict[str, int]:
    """The GEMM FLOPs this tree runs (reference/flops.py): torch skips the data's dx and stops
    a recompute early; the reference computes the dx and finishes every segment."""
    ref = case.impl == "reference"
    if case.model == "gpt":  # no GEMM of the transformer takes the token ids: no dx to skip
        return pgpt.phase_flops(case.gpt_case(), case.recompute, early_stop=not ref)
    return rflops.mlp_flops(case.sizes, case.batch, activation=case.activation,
                            dropout=case.dropout, recompute=case.recompute,
                            early_stop=not ref, input_requires_grad=ref)


def predict(case: ProfileCase, machine: dict[str, Any]) -> dict[str, Any]:
    """The sheet: bytes by category (the accountant), FLOPs and bytes moved per phase, each
    phase's roofline time and the slowest, the boundary timeline, one layer's saves."""
    rows, n_params = case.accountant()
    fl = tree_flops(case)
    batch = case.batch_bytes()
    x, y = batch["x"], batch["y"]
    work = {"data wait": {"moved": 2 * batch["gathered"]},
            "host-to-device": {"moved": x + y if machine["h2d_bytes_per_s"] else 0},
            "forward": {"flops": fl["forward"]},
            "backward": {"flops": fl["backward"] + fl["recompute"]},
            "optimizer": {"moved": rprof.optimizer_moved_bytes(
                n_params, OPTIMIZER_NAMES[case.optimizer])}}
    if case.impl == "reference":
        del work["host-to-device"]
    rate, bw = machine["matmul_flops_per_s"], machine["copy_bytes_per_s"]
    seconds = {p: rprof.roofline_seconds(**w, rate=rate, bandwidth=bw) for p, w in work.items()}
    if "host-to-device" in work and machine["h2d_bytes_per_s"]:
        seconds["host-to-device"] = work["host-to-device"]["moved"] / machine["h2d_bytes_per_s"]
    return {"case": asdict(case), "machine": machine, "n_params": n_params,
            "accountant": [asdict(r) for r in rows], "flops": fl, "work": work,
            "seconds": seconds, "slowest": rprof.slowest(seconds),
            "timeline": formula_timeline(case),
            "layer": {"index": listed_layer(case), "saves": predicted_saves(case)}}


def listed_layer(case: ProfileCase) -> int | str:
    """The layer (MLP: its index) or block (GPT: its path) whose saves the sheet lists."""
    return pgpt.LISTED_BLOCK if case.model == "gpt" else second_linear(case)


def predicted_saves(case: ProfileCase) -> list[dict[str, Any]]:
    """The listed layer's saves without recomputation, from the accountant's list."""
    device = case.device.split(":")[0]
    if case.model == "gpt":
        return pgpt.listed_saves(case.gpt_case(), device)
    layer = second_linear(case)
    return [{"name": e.name, "tensor": e.tensor, "shape": list(e.shape), "bytes": e.nbytes}
            for e in racc.mlp_saved(case.sizes, case.batch, activation=case.activation,
                                    dropout=case.dropout, precision=case.precision,
                                    device=device)[0] if e.layer == layer]


def second_linear(case: ProfileCase) -> int:
    """The layer whose saves the sheet lists: the second Linear (its input requires grad)."""
    layers = rflops.mlp_layers(case.sizes, case.activation, case.dropout)
    linears = [i for i, kind in enumerate(layers) if kind == "linear"]
    return linears[1] if len(linears) > 1 else linears[0]


def write_predictions(sheet: dict[str, Any], out: Path, markdown: str) -> dict[str, Any]:
    """Write predictions.json (with its time) and predictions.md; return path, sha256, time."""
    written_ns = time.time_ns()
    stamp = datetime.datetime.fromtimestamp(written_ns / 1e9, datetime.UTC)
    sheet = {**sheet, "written_ns": written_ns, "written_at": stamp.isoformat()}
    body = json.dumps(sheet, indent=1).encode()
    path = out / "predictions.json"
    path.write_bytes(body)
    (out / "predictions.md").write_text(markdown, encoding="utf-8")
    return {"path": str(path), "sha256": hashlib.sha256(body).hexdigest(),
            "written_ns": written_ns, "written_at": sheet["written_at"]}


def with_batch(case: ProfileCase, batch: int) -> ProfileCase:
    return dataclasses.replace(case, batch=batch)
