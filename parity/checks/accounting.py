"""Quick checks of the accounting claims: a fixed grid of MLP steps through the drivers, each
measured integer against its prediction (observed = the count of differing integers)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from parity.compare import measure
from parity.drivers import accounting as drv
from parity.report import Observation, check
from parity.tolerances import claim
from reference import accounting as racc

STATE = ("weights", "grads", "master", "grad_buffer", "optimizer_state", "optimizer_step")
PHASES = ("forward", "backward", "recompute", "optimizer")
ACTIVATIONS = ("activations: model", "activations: loss", "activations: GradScaler")
SPECS = ("none", "sqrt", "uniform:2", "optimal:1", "optimal:2")
BASE = drv.MLPCase(sizes=(6, 10, 8, 10, 3), batch=5, activation="gelu", dropout=0.25)


def _mismatches(claim_id: str, measured: list[int], predicted: list[int]) -> float:
    return measure(claim(claim_id), np.array(measured, dtype=np.int64),
                   np.array(predicted, dtype=np.int64))


def _predicted(case: drv.MLPCase, names: tuple[str, ...]) -> list[int]:
    by_name = {r.name: r.predicted for r in drv.predict_mlp(case)}
    return [by_name[n] for n in names]  # type: ignore[misc]


@check("accounting.state_bytes")
def _() -> Observation:
    bad, n = 0.0, 0
    for precision, optimizer in itertools.product(racc.PROJECT_PRECISIONS, drv.OPTIMIZERS):
        case = dataclasses.replace(BASE, precision=precision, optimizer=optimizer)
        predicted = _predicted(case, STATE)
        for state in (drv.torch_step(case)["state"], drv.reference_step(case)["state"]):
            measured = [state.get(k, 0) for k in STATE]  # type: ignore[union-attr]
            bad, n = bad + _mismatches("accounting.state_bytes", measured, predicted), n + 6
        for lp in ("bf16", "fp16"):
            state = drv.torch_low_precision_weights_step(case, lp, master=True)
            mem = racc.training_memory(case.n_params, optimizer=optimizer,
                                       precision=f"{lp}_mixed", master_weights=True)
            measured = [state.get(k, 0) for k in STATE[:-1]]
            predicted_lp = [mem[k] for k in STATE[:-1]]
            bad, n = bad + _mismatches("accounting.state_bytes", measured, predicted_lp), n + 5
    return Observation(bad, n, "3 autocast precisions x 4 optimizers, both trees; bf16/fp16 "
                               "weights with float32 master copies")


@check("accounting.flops")
def _() -> Observation:
    bad, n = 0.0, 0
    for precision, spec, early in itertools.product(racc.PROJECT_PRECISIONS, SPECS,
                                                    (True, False)):
        case = dataclasses.replace(BASE, precision=precision, recompute=spec, early_stop=early)
        predicted = _predicted(case, PHASES)
        for fl in (drv.torch_step(case)["flops"], drv.torch_meta_flops(case)):
            measured = [fl[k] for k in PHASES]  # type: ignore[index]
            bad, n = bad + _mismatches("accounting.flops", measured, predicted), n + 4
    big = dataclasses.replace(BASE, sizes=(8192, 65536, 65536, 8192), batch=8192,
                              recompute="sqrt")
    measured = [drv.torch_meta_flops(big)[k] for k in PHASES]
    bad += _mismatches("accounting.flops", measured, _predicted(big, PHASES))
    return Observation(bad, n + 4, "3 precisions x 5 schedules x early stop on/off, CPU and "
                                   "meta; a 5.4e9-parameter MLP on meta")


@check("accounting.tape_flops")
def _() -> Observation:
    bad, n = 0.0, 0
    for spec, early in itertools.product(SPECS, (True, False)):
        case = dataclasses.replace(BASE, recompute=spec, early_stop=early)
        predicted = _predicted(case, PHASES[:3])
        mine = drv.reference_step(case)
        fl = mine["flops"]
        cut = fl["cut"] if early else 0  # type: ignore[index]
        measured = [fl["forward"], fl["backward"] - drv.first_dx(case),  # type: ignore[index]
                    fl["recompute"] - cut]  # type: ignore[index]
        if mine["tape_forward"] is not None:
            measured, predicted = [*measured, mine["tape_forward"]], [*predicted, predicted[0]]
        bad, n = bad + _mismatches("accounting.tape_flops", measured, predicted), \
            n + len(measured)  # type: ignore[arg-type]
    return Observation(bad, n, "5 schedules x early stop on/off, float32")


@check("accounting.activation_bytes")
def _() -> Observation:
    bad, n = 0.0, 0
    for precision, spec in itertools.product(racc.PROJECT_PRECISIONS, SPECS):
        case = dataclasses.replace(BASE, precision=precision, recompute=spec)
        predicted = _predicted(case, ACTIVATIONS)
        held = drv.torch_step(case)["held"]
        measured = [held["model"], held["loss"], held["other"]]  # type: ignore[index]
        bad, n = bad + _mismatches("accounting.activation_bytes", measured, predicted), n + 3
        tape = drv.reference_step(case)["held"]
        mine = [tape["model"] - drv.first_weight_cast(case), tape["loss"] + 4,  # type: ignore[index]
                tape["other"] + drv.scaler_saved(case)]  # type: ignore[index]
        bad, n = bad + _mismatches("accounting.activation_bytes", mine, predicted), n + 3
        theirs, ours = drv.held_forward(case, "float64")
        expected = racc.mlp_activation_bytes(case.sizes, case.batch, activation=case.activation,
                                             dropout=case.dropout, itemsize=8, recompute=spec)
        bad, n = bad + _mismatches("accounting.activation_bytes", [theirs, ours],
                                   [expected, expected]), n + 2
    return Observation(bad, n, "3 precisions x 5 schedules, torch and the reference tape; "
                               "float64 forwards in both trees")
