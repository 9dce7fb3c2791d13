"""Quick checks of the formats claims for `python -m parity report` (see parity/test_formats.py).

Inputs are deterministic: every code of the 8-bit formats, a seeded sample of the 16-bit
ones, their exact ties and the float32 values one and two ulps either side, plus seeded
random bit patterns (parity/drivers/formats.py).
"""

from __future__ import annotations

import numpy as np

from parity import oracles
from parity.compare import measure
from parity.drivers import formats as drive
from parity.report import Observation, check
from parity.sweep import sweep_sample
from parity.tolerances import claim


def _worst(claim_id: str, pairs: list[tuple[np.ndarray, np.ndarray]], note: str = ""
           ) -> Observation:
    c = claim(claim_id)
    return Observation(max(measure(c, a, b) for a, b in pairs), sum(a.size for a, _ in pairs),
                       note)


@check("formats.ranges")
def _() -> Observation:
    pairs = []
    for name in oracles.ALL_FORMATS:
        r = drive.ranges(name)
        pairs += [(r["torch"], r["reference"])]
        pairs += [(r["ml_dtypes"], r["reference"])] if "ml_dtypes" in r else []
    return _worst("formats.ranges", pairs)


@check("formats.decode")
def _() -> Observation:
    pairs = []
    for name in oracles.STORAGE_FORMATS:
        d = drive.decode_every_code(name)
        pairs += [(d["torch"], d["reference"]), (d["ml_dtypes"], d["reference"])]
    return _worst("formats.decode", pairs)


@check("formats.encode_f32")
def _() -> Observation:
    pairs = []
    for name in oracles.ALL_FORMATS:
        x = drive.edge_inputs(name)
        pairs.append(drive.nearest_vs_torch(x, name))
        if name in oracles.ML_DTYPES:
            pairs.append(drive.nearest_vs_ml_dtypes(x, name))
    return _worst("formats.encode_f32", pairs)


@check("formats.encode_f64_correct")
def _() -> Observation:
    pairs = []
    for name in oracles.ALL_FORMATS:
        got_ref, got_torch, oracle = drive.correctly_rounded(drive.edge_inputs_float64(name), name)
        pairs += [(got_ref, oracle), (got_torch, oracle)]
    return _worst("formats.encode_f64_correct", pairs)


@check("formats.encode_f64_via_f32")
def _() -> Observation:
    pairs = [drive.via_float32_vs_torch(drive.edge_inputs_float64(name), name)
             for name in oracles.STORAGE_FORMATS]
    return _worst("formats.encode_f64_via_f32", pairs)


@check("formats.toward_zero")
def _() -> Observation:
    pairs = []
    for name in oracles.ALL_FORMATS:
        for x in (drive.edge_inputs(name), drive.edge_inputs_float64(name)):
            for overflow in ("saturate", "nan"):
                pairs.append(drive.toward_zero(x, name, overflow))
    return _worst("formats.toward_zero", pairs)


@check("formats.stochastic_bits")
def _() -> Observation:
    pairs = []
    rng = np.random.default_rng(1)
    for name in oracles.ALL_FORMATS:
        for x in (drive.edge_inputs(name), drive.edge_inputs_float64(name)):
            words = rng.integers(0, 2**32, size=x.shape, dtype=np.uint32)
            for overflow in ("saturate", "nan"):
                pairs.append(drive.stochastic_same_words(x, name, words, overflow))
    return _worst("formats.stochastic_bits", pairs)


@check("formats.stochastic_unbiased")
def _() -> Observation:
    pairs, unconfirmed = [], 0
    for name in oracles.ALL_FORMATS:
        for x in (drive.edge_inputs(name, n_codes=256, n_random=256),
                  drive.edge_inputs_float64(name, n_codes=64, n_random=256)):
            x = drive.stochastic_domain(x, name)
            oracle = drive.oracle_words_rounding_up(x, name)
            for side in ("reference", "torch"):
                count, confirmed = drive.words_rounding_up(x, name, side)
                pairs.append((count, oracle))
                unconfirmed += int(np.count_nonzero(~confirmed))
    note = f"{unconfirmed} counts not confirmed at random words" if unconfirmed else ""
    obs = _worst("formats.stochastic_unbiased", pairs, note)
    return Observation(obs.observed + unconfirmed, obs.n, obs.note)


@check("formats.contract")
def _() -> Observation:
    outcomes = drive.contract()
    differ = [label for label, expected, a, b in outcomes if not a == b == expected]
    return Observation(float(len(differ)), len(outcomes), "; ".join(differ[:3]))


@check("formats.sweep")
def _() -> Observation:
    total, bad = 0, 0
    for name in oracles.STORAGE_FORMATS:
        s = sweep_sample(name, 1 << 20, seed=3)
        total += s.total
        bad += s.mismatches_torch + s.mismatches_ml_dtypes
    return Observation(float(bad), total, "2^20 random float32 bit patterns per format")
