"""`python -m parity audit` on a checkpoint with nanoGPT's train.py layout, the one
examples/nanogpt_train.py writes (model, optimizer, model_args, iter_num, best_val_loss and
config, every configuration global of the script, read here from its source), written by
torch.save in the test: the verdicts and rows that tests/test_audit_nanogpt_resume.py holds
to real resumes (slow), checked by default on the same layout (it asserts the layouts match).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

from parity.lab import audit_nanogpt as nanogpt
from parity.lab.cli import EXIT_FAILED, EXIT_UNKNOWN
from tests.test_audit import audit, rows

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "nanogpt_train.py"
USABLE = ("present", "disabled", "not needed")


def script_config() -> dict[str, Any]:
    """The script's configuration globals as its `config` holds them: the constants assigned
    at the top of examples/nanogpt_train.py, up to the line that lists them."""
    config: dict[str, Any] = {}
    for node in ast.parse(SCRIPT.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        if node.targets[0].id == "config_keys":
            return config
        if isinstance(node.value, ast.Constant):
            config[node.targets[0].id] = node.value.value
    raise AssertionError(f"no config_keys line in {SCRIPT}")


def train_py_checkpoint(rng: bool, **overrides: Any) -> dict[str, Any]:
    """A checkpoint with the keys and value types the script saves at iteration 4: a small
    model's and AdamW's state after a step, model_args, iter_num, best_val_loss (a 0-d tensor,
    the eval's mean), config; the torch CPU RNG's state as "rng_state" if `rng`."""
    config = {**script_config(), **overrides}
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8)).sum().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "model_args": {k: config[k] for k in ("n_layer", "n_head", "n_embd",
                                                  "block_size", "bias", "dropout")}
            | {"vocab_size": 8},
            "iter_num": 4, "best_val_loss": torch.tensor(1.5), "config": config}
    if rng:
        ckpt["rng_state"] = torch.get_rng_state()
    return ckpt


@pytest.mark.parametrize(("config", "rng", "status", "gaps", "scaler_need"), [
    ({"dtype": "float16"}, False, EXIT_FAILED, {"torch CPU RNG", "data position", "epoch"},
     "if trained in float16 on CUDA"),
    ({"dtype": "float16"}, True, EXIT_UNKNOWN, set(), "if trained in float16 on CUDA"),
    ({"dtype": "bfloat16"}, True, EXIT_UNKNOWN, set(), "if trained in fp16"),
    ({"dtype": "float16", "device": "cuda"}, True, EXIT_FAILED, {"scaler"}, "required"),
    ({"dtype": "float16", "device": "cuda:1"}, True, EXIT_FAILED, {"scaler"}, "required"),
    # 'mps' has no 'cuda' in it: train.py runs it as device_type 'cpu', float32, no autocast
    ({"dtype": "float16", "device": "mps"}, True, EXIT_UNKNOWN, set(),
     "if trained in float16 on CUDA"),
])
def test_a_train_py_checkpoint_is_read_as_train_py_runs(
        config: dict[str, Any], rng: bool, status: int, gaps: set[str], scaler_need: str,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No scheduler (its lr is get_lr(iter_num)); no scaler on a device without 'cuda' in
    its name (train.py's device_type is then 'cpu', and its GradScaler disables itself
    without CUDA) nor in bfloat16; without the RNG impossible,
    naming it; with it unknown, never exact."""
    torch.save(train_py_checkpoint(rng, **config), tmp_path / "ckpt.pt")
    got, report, _ = audit(tmp_path / "ckpt.pt", capsys)
    r = rows(report)
    assert (got, report["exact"]) == (status, False)
    assert {i for i, row in r.items()
            if row["need"] == "required" and row["status"] not in USABLE} == gaps
    assert r["scheduler"]["status"] == "not needed"
    assert r["scaler"]["need"] == scaler_need
    assert r["scaler"]["status"] == ("missing" if "scaler" in gaps else "not needed")
    assert r["global step"]["detail"] == "iter_num = 4"
    assert (r["torch CPU RNG"]["status"], r["torch CPU RNG"]["where"]) == \
        (("present", "rng_state") if rng else ("missing", ""))


def test_without_the_rng_the_flag_says_what_the_resume_cost_and_the_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The verdict names the torch CPU RNG; the nanoGPT flag, the measured cost of resuming
    without it and the fix that measured exact."""
    torch.save(train_py_checkpoint(rng=False), tmp_path / "ckpt.pt")
    _, report, _ = audit(tmp_path / "ckpt.pt", capsys)
    assert report["verdict"] == ("exact resume impossible: torch CPU RNG, data position, "
                                 "epoch missing")
    [flag] = [f for f in report["flags"] if f.startswith("nanoGPT-style")]
    cost = nanogpt.MEASURED["no"]
    assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors differing. Fix: {nanogpt.FIX}" in flag


def test_with_the_rng_unknown_says_where_it_must_be_taken(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With an RNG state the file cannot show whether it was taken before train.py's
    prefetch: unknown, with both measurements and the fix. A nanoGPT-style file without
    train.py's config (a loop of the user's own) keeps the generic reason."""
    torch.save(train_py_checkpoint(rng=True), tmp_path / "ckpt.pt")
    _, report, _ = audit(tmp_path / "ckpt.pt", capsys)
    at_save = nanogpt.MEASURED["at_save"]
    assert report["unknown"].startswith("train.py draws the batch its next step trains on")
    assert f"max |Δw| {at_save[0]:g}, {at_save[1]} tensors differing" in report["unknown"]
    assert report["unknown"].endswith(f"Fix: {nanogpt.FIX}")
    own_loop = {k: v for k, v in train_py_checkpoint(rng=True).items() if k != "config"}
    torch.save(own_loop, tmp_path / "own.pt")
    got, report, _ = audit(tmp_path / "own.pt", capsys)
    assert got == EXIT_UNKNOWN and report["unknown"].startswith("nanoGPT's get_batch")


def test_the_page_prints_the_measured_resumes() -> None:
    """docs/your-trainer.md's nanoGPT table holds MEASURED (the slow test measures it again),
    each row beside the way of saving it measured."""
    page = (SCRIPT.parents[1] / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    table = {line.split(" | ")[0].split("`")[-2]: line.rsplit(" | ", 1)[-1]
             for line in page.splitlines() if line.startswith(("| train.py's keys alone",
                                                               "| `rng_state` taken"))}
    expected = {k: "**0** |" if v == (0.0, 0) else f"{v[0]:g} ({v[1]}) |"
                for k, v in nanogpt.MEASURED.items()}
    assert table == expected
