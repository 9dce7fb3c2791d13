"""Training runs on either tree: uninterrupted, interrupted and resumed, resumed with an
item of the inventory left out, and real training processes killed with SIGKILL.

    python -m parity.drivers.train     measures the inventory damage (deterministic, no
                                       timing) into docs/data/resume_inventory.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from parity.compare import as_numpy, measure
from parity.drivers.resume import flatten
from parity.tolerances import claim
from reference import train as ref_train

ROOT = Path(__file__).resolve().parents[2]
INVENTORY_DATA = ROOT / "docs" / "data" / "resume_inventory.json"


# A small run: 5 batches an epoch, dropout on (so the random stream matters)
SMALL = {"sizes": (8, 16, 3), "dropout": 0.2, "batch_size": 8, "num_samples": 40}


def impl(name: str) -> ModuleType:
    """reference.train or torch_impl.train (torch is imported only when asked for)."""
    if name == "reference":
        return ref_train
    from torch_impl import train as torch_train

    return torch_train


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the duration (restored after).

    On a small shared machine torch's default thread pool makes this tiny MLP ~40x slower
    (contention, not work); one thread changes no result within a run, and every run that
    is compared runs under the same setting.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def on(name: str, device: str) -> dict[str, Any]:
    """The keyword that puts a torch run on `device` (the reference has none)."""
    return {} if name == "reference" else {"device": device}


def uninterrupted(name: str, config: dict[str, Any], total: int, device: str = "cpu"
                  ) -> dict[str, Any]:
    """The final complete state of a run of `total` steps without checkpoints."""
    m = impl(name)
    return m.train(m.TrainConfig(**config), total, **on(name, device)).state_dict()


def interrupted(name: str, config: dict[str, Any], k: int, total: int, directory: Path,
                every: int = 0, device: str = "cpu") -> dict[str, Any]:
    """Train to step k writing checkpoints (every `every` steps, and at k), drop every
    object, then resume from the newest valid file in `directory` to `total`."""
    m = impl(name)
    cfg = m.TrainConfig(**config)
    m.train(cfg, k, directory, every or k, **on(name, device))
    return m.train(cfg, total, directory, every or k, resume_from_latest=True,
                   **on(name, device)).state_dict()


def resumed_without(name: str, config: dict[str, Any], k: int, total: int, directory: Path,
                    omit: tuple[str, ...], device: str = "cpu",
                    change: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                    batches: list[Any] | None = None) -> dict[str, Any]:
    """Like `interrupted`, but the items in `omit` are NOT restored (they stay fresh), and
    the loaded state is first passed through `change` (an entry reset, for the audit's
    measurements); `batches` collects the batch of every step after the resume."""
    m = impl(name)
    cfg = m.TrainConfig(**config)
    m.train(cfg, k, directory, k, **on(name, device))
    path = m.resume.CheckpointManager(directory).checkpoints()[-1][1]
    state = m.resume.load_checkpoint(path)
    run = m.restored(cfg, state if change is None else change(state), omit,
                     **on(name, device))
    while run.step < total:
        run.train_step()
        if batches is not None:
            batches.append(run.last_batch)
    return run.state_dict()


def compare_runs(actual: dict[str, Any], expected: dict[str, Any]) -> tuple[float, int]:
    """(mismatching values over every leaf of two complete states, values compared)."""
    c = claim("train.resume_exact")
    a, b = flatten(actual), flatten(expected)
    if sorted(a) != sorted(b):
        return float("inf"), 0
    worst, n = 0.0, 0
    for key, value in b.items():
        if a[key].shape != value.shape or a[key].dtype != value.dtype:
            return float("inf"), n
        worst += measure(c, a[key], value)
        n += value.size
    return worst, n


def max_param_difference(actual: dict[str, Any], expected: dict[str, Any]) -> float:
    """max |a - b| over every parameter of two states (float64)."""
    return max(float(np.max(np.abs(as_numpy(actual["model"][k]).astype(np.float64)
                                   - as_numpy(v).astype(np.float64))))
               for k, v in expected["model"].items())


def cross_impl_resume(writer: str, reader: str, directory: Path, device: str = "cpu",
                      model: str = "mlp", precision: str = "fp32"
                      ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """`writer` trains 5 steps (horizon 9) of `model` at `precision` into `directory`;
    `reader` resumes it through the cross-implementation mapping, once asked for 5 steps,
    once for 9. Returns (what, actual, expected) byte arrays: the digest at step 5 against
    the writer's, then step, skipped count, data position, lr and (a precision that rounds
    stochastically) the random bits' stream against an uninterrupted `reader` run of 9
    steps."""
    from parity.drivers.resume_cross import converters

    config = {"seed": 3, "horizon": 9, "model": model, "precision": precision}
    w, r = impl(writer), impl(reader)
    written = w.train(w.TrainConfig(**config), 5, directory, 5, **on(writer, device))
    at_k = r.train(r.TrainConfig(**config), 5, directory, 5, resume_from_latest=True,
                   foreign=converters(reader), **on(reader, device))
    run = r.train(r.TrainConfig(**config), 9, directory, 5, resume_from_latest=True,
                  foreign=converters(reader), **on(reader, device))
    own = r.train(r.TrainConfig(**config), 9, **on(reader, device))

    def text(value: Any) -> np.ndarray:
        return np.frombuffer(repr(value).encode(), np.uint8)

    out = [("digest at the checkpoint's step",
            np.frombuffer(bytes.fromhex(r.state_digest(at_k.state_dict())), np.uint8),
            np.frombuffer(bytes.fromhex(w.state_digest(written.state_dict())), np.uint8)),
           ("step", text(run.step), text(own.step)),
           ("skipped", text(run.skipped), text(own.skipped)),
           ("data position", text(run.sampler.state_dict()), text(own.sampler.state_dict())),
           ("lr", text(run.scheduler.get_last_lr()), text(own.scheduler.get_last_lr()))]
    if own.bits is not None:  # the one stream both trees draw (NOTE [ Cross-implementation
        out.append(("bits", text(run.bits.state()), text(own.bits.state())))  # mapping ])
    return out


# ---------------------------------------------------------------- real processes

_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # see one_thread()


def cli(name: str, directory: Path, steps: int, options: tuple[str, ...]) -> list[str]:
    """The argv of a training process."""
    return [sys.executable, "-m", "parity", "train", "--impl", name, "--steps", str(steps),
            "--checkpoint-dir", str(directory), "--resume", *options]


def run_to_end(name: str, directory: Path, steps: int, options: tuple[str, ...]
               ) -> tuple[str, list[str]]:
    """(state-sha256, output lines) of a training process that runs to completion."""
    done = subprocess.run(cli(name, directory, steps, options), cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=True, env=_ENV)
    lines = done.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("state-sha256: "):
        raise AssertionError(f"no digest line; output ended {lines[-3:]}; {done.stderr[-500:]}")
    return lines[-1].removeprefix("state-sha256: "), lines


def kill_at(name: str, directory: Path, steps: int, options: tuple[str, ...], *,
            delay: float | None = None, after_file: str | None = None) -> bool:
    """Start a resuming process and SIGKILL it after `delay` seconds, or as soon as the file
    `after_file` appears in `directory`, or (both given) `delay` seconds after it appears.
    True if it was killed (not finished first)."""
    proc = subprocess.Popen(cli(name, directory, steps, options), cwd=ROOT, env=_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        start = time.monotonic()
        while proc.poll() is None:
            if after_file is not None and (directory / after_file).exists():
                if delay is None:
                    break
                start, after_file = time.monotonic(), None  # now count the delay from here
            if after_file is None and delay is not None and time.monotonic() - start >= delay:
                break
            time.sleep(0.0005 if after_file else 0.005)
        if proc.poll() is not None:
            return False
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        return True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


KILL_OPTIONS = ("--checkpoint-every", "1", "--precision", "fp16", "--init-scale", "262144",
                "--growth-interval", "3", "--dropout", "0.1", "--keep", "2")
# the transformer under the same fp16 options skips steps too (its Linears run in fp16):
# with every block recomputed and the attention core on top
GPT_KILL_OPTIONS = (*KILL_OPTIONS, "--model", "gpt", "--recompute", "optimal:2+selective")


def skipped_steps(lines: list[str]) -> list[int]:
    """Steps whose progress line says `skipped 1`."""
    return [int(line.split()[1]) for line in lines
            if line.startswith("step ") and " skipped 1 " in line]


# ---------------------------------------------------------------- the inventory, measured

INVENTORY_CASE = {**SMALL, "precision": "fp16", "init_scale": 2.0**20, "growth_interval": 3,
                  "schedule": "cosine", "horizon": 20}


def inventory_damage(name: str, k: int = 5, total: int = 12) -> dict[str, float]:
    """item -> max |param difference| at `total` after resuming at `k` without that item.

    INVENTORY_CASE: fp16 with overflow-skipped steps, dropout 0.2, cosine lr, 5-batch
    epochs. "none" is the complete checkpoint (0 when resume is exact); "weights only" is
    every item but the model left out.
    """
    with one_thread():
        expected = uninterrupted(name, INVENTORY_CASE, total)
        m = impl(name)
        rows = {"none": (), **{item: (item,) for item in m.INVENTORY},
                "weights only": tuple(i for i in m.INVENTORY if i != "model")}
        out = {}
        for label, omit in rows.items():
            with tempfile.TemporaryDirectory() as tmp:
                actual = resumed_without(name, INVENTORY_CASE, k, total, Path(tmp), omit)
            out[label] = max_param_difference(actual, expected)
    return out


def write_inventory(path: Path = INVENTORY_DATA) -> dict[str, Any]:
    """Measure inventory_damage on both trees and write it (docs/resume.md's table)."""
    import platform

    import torch

    data = {"case": "fp16 with overflow-skipped steps, dropout 0.2, cosine lr over 20 steps, "
                    "5-batch epochs; checkpoint at step 5, compared at step 12",
            "torch": torch.__version__, "numpy": np.__version__, "machine": platform.machine(),
            "reference": inventory_damage("reference"), "torch_impl": inventory_damage("torch")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return data


if __name__ == "__main__":
    print(json.dumps(write_inventory(), indent=1))
