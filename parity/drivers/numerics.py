"""The numerics detector on both trees: seeded faults found, replay files written and
replayed, the format view of one array counted by each tree.

Both trees start a faulted run from the SAME weights: the reference trains one step into a
checkpoint, and each tree resumes it (the torch tree through the cross-implementation
mapping), so the data order, the weights and the fault are the same bits in both.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import ckpt
from parity.drivers.train import impl
from reference import numerics as ref_numerics
from reference import train as ref_train
from reference.faults import FAULTS, Fault, fault_named

# the default model (8, 32, 32, 3): the second Linear is module "2"; no dropout (the two
# trees' masks differ), so the runs are the same arithmetic up to rounding
FAULTED = {"seed": 0, "horizon": 12, "sizes": (8, 32, 32, 3)}
# the transformer (TRAIN_SHAPE, 4 blocks, the copy task), no dropout
GPT_FAULTED = {"seed": 0, "horizon": 12, "model": "gpt"}


def faulted_config(fault: str, precision: str) -> dict[str, Any]:
    """The configuration a catalogued fault is observed in: FAULTED or GPT_FAULTED by the
    model the fault is written for."""
    return {**(GPT_FAULTED if fault_named(fault).model == "gpt" else FAULTED),
            "precision": precision}


def numerics_module(name: str) -> Any:
    """reference.numerics or torch_impl.numerics."""
    if name == "reference":
        return ref_numerics
    from torch_impl import numerics as torch_numerics

    return torch_numerics


def seed_directory(directory: Path, config: dict[str, Any]) -> None:
    """The common start: the reference's run after one step, as a checkpoint in `directory`."""
    ref_train.train(ref_train.TrainConfig(**config), 1, directory, 1)


def faulted_run(name: str, config: dict[str, Any], fault: str | Fault | None, fault_step: int,
                steps: int, start: Path, work: Path) -> tuple[Any, ref_numerics.NonFinite | None]:
    """`name` resumes a copy of `start` (seed_directory) in `work` and trains to `steps` with
    the detector on and `fault` seeded before `fault_step`. Returns (the run or None,
    the NonFinite it raised or None)."""
    from parity.drivers.resume_cross import converters

    shutil.copytree(start, work)
    m = impl(name)
    try:
        run = m.train(m.TrainConfig(**config), steps, work, 0, resume_from_latest=True,
                      foreign=converters(name), check_numerics=True,
                      fault=fault_named(fault) if isinstance(fault, str) else fault,
                      fault_step=fault_step)
    except ref_numerics.NonFinite as e:
        return None, e
    return run, None


# ---------------------------------------------------------------- replay files

REPLAY_KIND = "replay"


def save_replay(name: str, path: Path, replay: dict[str, Any]) -> None:
    """Write a NonFinite's replay state with `name`'s payload (the checkpoint container)."""
    impl(name).resume.save_checkpoint(path, replay, {"kind": REPLAY_KIND})


def load_replay(name: str, path: Path) -> dict[str, Any]:
    """A replay file as `name`'s state, whichever tree wrote it (arrays/tensors converted;
    a converted file's random state is dropped: the other tree's generator differs)."""
    from parity.drivers.resume_cross import converters

    with ckpt.open_checkpoint(path) as c:
        header = dict(c.header)
    if (header.get("meta") or {}).get("kind") != REPLAY_KIND:
        raise ckpt.CheckpointMismatchError(f"{path}: not a replay file (a checkpoint?); "
                                           "the train command's --check-numerics writes one")
    m = impl(name)
    if header.get("payload") == m.resume.PAYLOAD:
        return m.resume.load_checkpoint(path)
    state = converters(name)[header.get("payload")](path)  # a KeyError: an unknown payload
    batch = state["batch"]
    if name == "reference":
        state["batch"] = {k: v.detach().cpu().numpy() for k, v in batch.items()}
    else:
        import torch

        state["batch"] = {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}
    return state


def replay(name: str, path: Path, device: str = "cpu") -> ref_numerics.ReplayResult:
    """The anomaly replay of a replay file on `name`'s tree: one step on the saved batch
    from the saved state, forward and backward, stopped before the optimizer."""
    state = load_replay(name, path)
    m = impl(name)
    config = m.TrainConfig(**{k: tuple(v) if k == "sizes" else v
                              for k, v in state["config"].items()})
    extra = {} if name == "reference" else {"device": device}
    run = m.restored(config, state, **extra)
    if state.get("loss") is not None:  # a fault's loss: code, recorded by name
        run.loss_fn = m.faults.LOSSES[state["loss"]]()
    x, y = state["batch"]["x"], state["batch"]["y"]
    if name != "reference":
        x, y = x.to(run.device), y.to(run.device)
    return numerics_module(name).anomaly_replay(
        run.model, run.loss_fn, lambda phase: run.train_step((x, y), phase))


# ---------------------------------------------------------------- one array, both trees

def count_rows(x: np.ndarray, fmt: str, device: str = "cpu",
               arithmetic: bool | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(reference row, torch row) of COLUMNS for the same float32 array `x`, viewed in fmt
    (`arithmetic`: which way torch numbers the values, NOTE [ One pass of counting ]; "cast":
    the detector's count_table, NOTE [ Counting by the magnitude's extremes ])."""
    import torch

    from common.format_spec import get_format
    from torch_impl import numerics as t_numerics
    from torch_impl.format_spec import get_format as t_get_format

    ref = ref_numerics.count_rows([x], get_format(fmt))[0]
    tensor, dtype = torch.from_numpy(x).to(device), t_get_format(fmt).dtype
    if arithmetic == "cast":  # padded with ones (in range, in no column) to the size
        from torch_impl.numerics_extremes import EXTREMES_FROM  # count_table counts by the
        # magnitude's extremes: the same row
        padded = np.concatenate([x, np.ones(max(0, EXTREMES_FROM - x.size), np.float32)])
        got = t_numerics.count_table([torch.from_numpy(padded).to(device)], dtype)[0]
        return ref, np.array(got, dtype=np.int64)
    got = t_numerics.count_rows([tensor], dtype, arithmetic)[0]
    return ref, got.cpu().numpy()


# ---------------------------------------------------------------- the catalogue, observed

CATALOGUE = (("weight_overflow", "fp16"), ("inf_weight", "fp32"), ("poisoned_batch", "bf16"),
             ("log_of_zero", "fp32"), ("lr_divergence", "fp32"),
             ("attention_overflow", "fp16"), ("layernorm_eps0", "fp32"),
             ("poisoned_embedding", "bf16"), ("gelu_backward", "fp32"),
             ("residual_overflow", "fp32"))


def observe_catalogue(root: Path) -> list[dict[str, Any]]:
    """Each catalogued fault (seeded before step 3 from the common start) as both trees
    report it: the first-invalid identity, the inputs already out of range, and the node
    each tree's replay names."""
    rows = []
    for fault, precision in CATALOGUE:
        config = faulted_config(fault, precision)
        start = root / f"start-{config.get('model', 'mlp')}-{precision}"
        if not start.exists():
            seed_directory(start, config)
        row: dict[str, Any] = {"fault": fault, "precision": precision}
        for name in ("reference", "torch"):
            _, found = faulted_run(name, config, fault, 3, 5 + FAULTS[fault].delay, start,
                                   root / f"{name}-{fault}")
            if found is None:
                row[name] = None
                continue
            path = root / f"{name}-{fault}.replay"
            save_replay(name, path, found.replay)
            result = replay(name, path)
            row[name] = {**found.report.identity(),
                         "out_of_range": [r.name for r in found.report.inputs
                                          if r.out_of_range()],
                         "replay": [result.node, result.module]}
        rows.append(row)
    return rows


# ---------------------------------------------------------------- underflow, not NaN

def underflow_counts(name: str, seed: int, start: Path, work: Path, *,
                     repaired: bool = False) -> dict[str, list[int]]:
    """{parameter: its gradient's COLUMNS row} on the first step from `start` (FAULTED in
    fp16 with `seed`, after one step: seed_directory) with fp16_without_scaler seeded before
    it, or (`repaired`) with the same writes and the run's GradScaler kept."""
    config = {**FAULTED, "precision": "fp16", "seed": seed}
    fault = FAULTS["fp16_without_scaler"]
    if repaired:
        fault = replace(fault, scaler=True)
    run, found = faulted_run(name, config, fault, 1, 2,
                             start, work / f"{name}-{'repaired' if repaired else 'faulted'}")
    if found is not None:
        raise AssertionError(f"fp16_without_scaler: {name} found a non-finite value "
                             f"{found.report.line()}")
    assert len(run.numerics.history) == 1  # the fault's step, the only one
    return {k.removeprefix("grad:"): v for k, v in run.numerics.history[-1].items()
            if k.startswith("grad:")}


# a float16 run with a loss scale far too small (2^-16): gradients underflow to zero in the
# backward; ReLU zeros half the activations; weight_overflow is seeded before step 9
COUNTS_RUN = {"seed": 0, "horizon": 12, "precision": "fp16", "init_scale": 2.0**-16,
              "activation": "relu"}


# the same for the transformer: fp16, loss scale 2^-16, attention_overflow before step 9
GPT_COUNTS_RUN = {"seed": 0, "horizon": 12, "precision": "fp16", "init_scale": 2.0**-16,
                  "model": "gpt"}


def counts_history(name: str = "reference", model: str = "mlp"
                   ) -> tuple[list[dict[str, list[int]]], Any]:
    """The per-step counts of COUNTS_RUN (GPT_COUNTS_RUN for model "gpt"), the faulted
    step's included, and its report."""
    m = impl(name)
    config, fault = ((GPT_COUNTS_RUN, "attention_overflow") if model == "gpt"
                     else (COUNTS_RUN, "weight_overflow"))
    try:
        run = m.train(m.TrainConfig(**config), 12, check_numerics=True,
                      fault=FAULTS[fault], fault_step=9)
    except ref_numerics.NonFinite as e:
        return e.history, e.report
    return run.numerics.history, None


def json_bytes(value: object) -> np.ndarray:
    """A value as the bytes of its canonical JSON: an identifying tuple compared with a bits
    claim (step, module, op, phase as strings)."""
    return np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)


Found = Callable[[str, str, str], ref_numerics.NonFinite]


def runs_once(run: Callable[[str, str, str, Path], ref_numerics.NonFinite],
              tmp_path_factory: Any) -> Found:
    """found(tree, fault, precision) for a test module's fixture: `run(tree, fault,
    precision, work)` once per key, in a fresh directory from pytest's tmp_path_factory, so
    the module's catalogue test and replay test read the same faulted runs."""
    runs: dict[tuple[str, str, str], ref_numerics.NonFinite] = {}

    def found(name: str, fault: str, precision: str) -> ref_numerics.NonFinite:
        key = (name, fault, precision)
        if key not in runs:
            runs[key] = run(name, fault, precision,
                            tmp_path_factory.mktemp(f"{fault}-{precision}"))
        return runs[key]

    return found
