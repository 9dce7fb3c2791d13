"""Quick checks of the recompute claims for `python -m parity report` (see
parity/test_recompute.py): the drivers' fixed cases under every small schedule."""

from __future__ import annotations

import numpy as np

from common.gpt_config import GPTConfig
from parity.compare import measure
from parity.drivers.recompute import (
    CASES,
    SPECS_SMALL,
    counts_array,
    finished_predicted,
    plan_array,
    predicted_held_bytes,
    ref_case,
    torch_case,
)
from parity.drivers.recompute_gpt import SPECS as GPT_SPECS
from parity.drivers.recompute_gpt import ref_run, torch_run
from parity.report import Observation, check
from parity.tolerances import claim
from reference import recompute as rrc
from torch_impl import recompute as trc


def _grads_obs(side: str) -> Observation:
    c, bad, n = claim(f"recompute.grads_{side}"), 0.0, 0
    run = ref_case if side == "reference" else torch_case
    for case in CASES:
        _, base = run(case, "none")
        for spec in SPECS_SMALL:
            _, grads = run(case, spec)
            for key in base:
                bad, n = bad + measure(c, grads[key], base[key]), n + base[key].size
    return Observation(bad, n, f"{len(CASES)} models x {len(SPECS_SMALL)} schedules, dropout on")


check("recompute.grads_reference")(lambda: _grads_obs("reference"))
check("recompute.grads_torch")(lambda: _grads_obs("torch"))


def _measured_obs(cid: str) -> Observation:
    c, bad, n = claim(cid), 0.0, 0
    for case in CASES:
        for spec in SPECS_SMALL:
            run, _ = ref_case(case, spec)
            m, _ = torch_case(case, spec)
            if cid == "recompute.held_bytes":
                a, b = np.array([predicted_held_bytes(run)]), np.array([m.held_bytes])
            elif cid == "recompute.counts":
                a, b = counts_array(run.recomputed()), counts_array(m.started)
            else:
                a, b = finished_predicted(run), counts_array(m.finished)
            bad, n = bad + measure(c, a, b), n + a.size
    return Observation(bad, n, f"{len(CASES)} models x {len(SPECS_SMALL)} schedules")


for _cid in ("recompute.held_bytes", "recompute.counts", "recompute.early_stop"):
    check(_cid)(lambda cid=_cid: _measured_obs(cid))


@check("recompute.plans")
def _() -> Observation:
    c, bad, n = claim("recompute.plans"), 0.0, 0
    for n_layers in range(1, 65):
        for spec in ("none", "sqrt", "uniform:1", f"uniform:{n_layers}",
                     *(f"optimal:{s}" for s in (1, 2, 3, 5, 8))):
            a = plan_array(rrc.parse_schedule(spec, n_layers).plan)
            b = plan_array(trc.parse_schedule(spec, n_layers).plan)
            bad += measure(c, a, b) if a.shape == b.shape else 1
            n += a.size
        for s in (1, 2, 3, 5, 8):
            cost = np.array([rrc.revolve_cost(n_layers, s)])
            bad += measure(c, cost, np.array([rrc.binomial_cost(n_layers, s)]))
    return Observation(bad, n, "n = 1..64, S in 1, 2, 3, 5, 8")


# -- the transformer: per-block and selective (parity/drivers/recompute_gpt.py)
GPT_CASES = ((GPTConfig(n_layer=4, dropout=0.2), np.float32),
             (GPTConfig(n_layer=3, n_head=4, dropout=0.1, tie_weights=True), np.float64))


def _gpt_obs(cid: str) -> Observation:
    c, bad, n = claim(cid), 0.0, 0
    for config, dtype in GPT_CASES:
        args = (dtype, 2, config.block_size, 7)
        if cid == "recompute.gpt_held_bytes":
            for spec in ("none", *GPT_SPECS):
                a = np.array([ref_run(config, spec, *args).held_bytes])
                b = np.array([torch_run(config, spec, *args).held_bytes])
                bad, n = bad + measure(c, a, b), n + 1
            continue
        run = ref_run if cid == "recompute.gpt_grads_reference" else torch_run
        base = run(config, "none", *args)
        for spec in GPT_SPECS:
            grads = run(config, spec, *args).grads
            for key in base.grads:
                bad, n = bad + measure(c, grads[key], base.grads[key]), n + base.grads[key].size
    return Observation(bad, n, f"{len(GPT_CASES)} transformers x {len(GPT_SPECS)} specs, "
                               "dropout on")


for _cid in ("recompute.gpt_grads_reference", "recompute.gpt_grads_torch",
             "recompute.gpt_held_bytes"):
    check(_cid)(lambda cid=_cid: _gpt_obs(cid))
