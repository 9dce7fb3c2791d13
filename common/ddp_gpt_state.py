"""The state digest of one rank of the N-rank GPT run (`train --world-size N --model gpt`):
its flat sharded state (the table in torch_impl/sharded_ckpt.py, AdamW's rows) put in the
canonical order of common/state_digest.py (NOTE [ Canonical state digest ]), so that the
digest reads the same records as the single-process run's: model/<name> as the model's
entries, optim/<name>/<i> as parameter i's optimizer buffer <name> (AdamW's exp_avg,
exp_avg_sq and step), the scaler's scale and growth tracker, the data position. As there,
the step, the skipped count, the lr and schedule, and the random streams are not in it: a
wrong one shows in the parameters of the steps after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.state_digest import AsArray, sharded_state_digest

ADAMW_ENTRIES = ("step", "exp_avg", "exp_avg_sq")  # torch.optim.AdamW's per-parameter state


def gpt_rank_digest(state: Mapping[str, Any], as_array: AsArray) -> str:
    """state_digest of a GPT rank's flat sharded state (the module docstring)."""
    return sharded_state_digest(state, as_array, buffers={n: n for n in ADAMW_ENTRIES})
