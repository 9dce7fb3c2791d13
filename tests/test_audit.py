"""`python -m parity audit FILE`: real checkpoints written the way other trainers write them
(torch.save here, a safetensors header by its spec), audited: what is listed, the flags, the
exit status (0 exact resume possible, 1 impossible, 2 bad input), and the committed
consequences against a fresh measurement."""

from __future__ import annotations

import json
import pickle
import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab import audit_consequences as consequences
from parity.lab.audit_files import safetensors_header
from parity.lab.audit_pickle import pickle_names
from parity.lab.audit_recognize import (
    INCOMPLETE,
    ITEMS,
    MISSING,
    NOT_NEEDED,
    PRESENT,
    recognize,
)
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE, main

CACHED = consequences.load()


def audit(target: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any],
                                                                            str]:
    """(exit status, the --json object or {} if none, stderr) of an audit: stdout is the
    JSON object alone, or nothing (bad input)."""
    status = main(["audit", str(target), "--json"])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out else {}), err


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["item"]: r for r in report["rows"]}


def trained() -> dict[str, Any]:
    """A user's small model after two steps: state_dicts of everything a trainer holds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Dropout(0.1),
                                torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    for _ in range(2):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "scaler": scaler.state_dict()}


def nanogpt(t: dict[str, Any]) -> dict[str, Any]:
    """The keys nanoGPT's train.py saves."""
    return {"model": t["model"], "optimizer": t["optimizer"],
            "model_args": {"n_layer": 1, "n_head": 1, "n_embd": 4},
            "iter_num": 2, "best_val_loss": 1.5, "config": {"dtype": "float16"}}


def complete(t: dict[str, Any]) -> dict[str, Any]:
    return {**t, "rng": {"torch": torch.get_rng_state(),
                         "numpy": np.random.default_rng(0).bit_generator.state,
                         "python": random.getstate(),
                         # torch.cuda.get_rng_state_all()'s shape: one 16-byte Philox state
                         # (seed, offset) a device, written here without a GPU
                         "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2},
            "sampler": {"epoch": 1, "position": 16}, "epoch": 1, "global_step": 2}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors layout by its spec: u64 little-endian N, N bytes of JSON, the data."""
    header, data, offset = {}, b"", 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


# ---------------------------------------------------------------- what is listed


def test_nanogpt_checkpoint_lacks_scaler_rng_data_and_says_what_each_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(nanogpt(trained()), tmp_path / "ckpt.pt")
    status, report, _ = audit(tmp_path / "ckpt.pt", capsys)
    assert status == EXIT_FAILED and report["exact"] is False
    assert report["kind"] == "nanoGPT-style checkpoint"
    r = rows(report)
    assert [r[i]["status"] for i in ("model", "optimizer", "optimizer step counts",
                                     "global step")] == [PRESENT] * 4
    for item in ("scaler", "torch CPU RNG", "data position", "epoch"):
        assert (r[item]["status"], r[item]["need"]) == (MISSING, "required"), item
    assert r["global step"]["where"] == "iter_num"
    assert any(f.startswith("nanoGPT-style") for f in report["flags"])
    cost = r["data position"]["consequence"]
    assert cost["max_dparam"] == CACHED["entries"]["data position"]["max_dparam"] > 0
    assert cost["data_order"] == "repeats"
    assert cost["steps"] == consequences.TOTAL - consequences.K


def test_a_complete_checkpoint_is_exact_and_every_row_is_listed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(complete(trained()), tmp_path / "full.pt")
    status, report, _ = audit(tmp_path / "full.pt", capsys)
    assert (status, report["exact"]) == (EXIT_OK, True)
    r = rows(report)
    assert list(r) == list(ITEMS)
    assert {i for i, row in r.items() if row["status"] == PRESENT} == set(ITEMS)
    assert r["torch CPU RNG"]["where"] == "rng/torch"
    assert (r["CUDA RNG"]["where"], r["CUDA RNG"]["detail"]) == ("rng/cuda", "2 device(s)")
    assert r["numpy RNG"]["detail"] == "Generator (PCG64)"
    assert r["optimizer step counts"]["detail"] == "4 of 4 parameters have 'step' (= 2)"
    assert r["optimizer step counts"]["where"] == "optimizer/state"


def test_a_bare_state_dict_holds_the_model_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(trained()["model"], tmp_path / "weights.pt")
    status, report, _ = audit(tmp_path / "weights.pt", capsys)
    r = rows(report)
    assert status == EXIT_FAILED
    assert (r["model"]["status"], r["model"]["where"]) == (PRESENT, "(the whole file)")
    assert [i for i, row in r.items() if row["status"] == PRESENT] == ["model"]


def test_the_table_names_each_row_and_ends_with_the_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(nanogpt(trained()), tmp_path / "ckpt.pt")
    assert main(["audit", str(tmp_path / "ckpt.pt")]) == EXIT_FAILED
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("nanoGPT-style checkpoint")
    assert [line.split("  ")[0] for line in out[2:2 + len(ITEMS)]] == list(ITEMS)
    assert out[-1] == ("audit: exact resume impossible: scaler, torch CPU RNG, "
                       "data position, epoch missing")  # nanoGPT's lr is get_lr(iter_num)


def test_legacy_numpy_rng_is_refused_naming_the_global_and_never_retried(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = np.random.get_state()  # noqa: NPY002 (the legacy state is the subject)
    torch.save({**trained(), "np_rng": legacy}, tmp_path / "legacy.pt")
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or real(*a, **k))
    status, report, _ = audit(tmp_path / "legacy.pt", capsys)
    assert status == EXIT_FAILED and report["rows"] == []
    assert report["refused"].startswith("weights_only=True refuses it")
    assert any(g.startswith("numpy") and g.endswith("_reconstruct") for g in report["needs"])
    assert any("np.random.get_state()" in f for f in report["flags"])
    assert [c.get("weights_only") for c in calls] == [True]


def test_scaler_without_growth_tracker_is_incomplete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = complete(trained())
    state["scaler"] = {k: v for k, v in state["scaler"].items() if k != "_growth_tracker"}
    torch.save(state, tmp_path / "s.pt")
    status, report, _ = audit(tmp_path / "s.pt", capsys)
    scaler = rows(report)["scaler"]
    assert (status, scaler["status"]) == (EXIT_FAILED, INCOMPLETE)
    assert scaler["consequence"]["entry"] == "scaler growth tracker"
    assert any("_growth_tracker" in f for f in report["flags"])
    with pytest.raises(KeyError, match="_growth_tracker"):  # what the flag says torch does
        torch.amp.GradScaler("cpu").load_state_dict(state["scaler"])


def test_optimizer_state_without_step_is_incomplete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = complete(trained())
    per = state["optimizer"]["state"]
    state["optimizer"]["state"] = {i: {k: v for k, v in s.items() if k != "step" or i}
                                   for i, s in per.items()}
    torch.save(state, tmp_path / "o.pt")
    status, report, _ = audit(tmp_path / "o.pt", capsys)
    row = rows(report)["optimizer step counts"]
    assert (status, row["status"]) == (EXIT_FAILED, INCOMPLETE)
    assert row["detail"].startswith("3 of 4 parameters")


def test_the_projects_own_checkpoints_are_recognized(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for impl in ("torch", "reference"):
        run = tmp_path / impl
        assert main(["train", "--impl", impl, "--steps", "2", "--checkpoint-dir", str(run),
                     "--quiet"]) == EXIT_OK
        capsys.readouterr()
        for target in (run, run / "ckpt-00000002.ckpt"):
            status, report, _ = audit(target, capsys)
            assert status == EXIT_OK, (impl, report)
            assert report["kind"].startswith("mirrortrain checkpoint")
            assert any(f.endswith("all there") for f in report["flags"])
            r = rows(report)
            assert r["global step"]["detail"] == "step = 2"
            assert r["scaler"]["status"] == "disabled"  # fp32
        rng = "torch CPU RNG" if impl == "torch" else "numpy RNG"
        assert (r[rng]["status"], r[rng]["need"]) == (PRESENT, "required")
    assert r["torch CPU RNG"]["status"] == NOT_NEEDED  # the reference draws from numpy


# ---------------------------------------------------------------- what cannot be audited


def test_a_plain_pickle_is_refused_unread(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.pkl").write_bytes(pickle.dumps({"model": 1}))
    status, report, _ = audit(tmp_path / "p.pkl", capsys)
    assert status == EXIT_FAILED and report["refused"].startswith("a plain pickle")


def _truncated(tmp_path: Path) -> Path:
    torch.save(complete(trained()), tmp_path / "full.pt")
    raw = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[:len(raw) // 2])
    return tmp_path / "cut.pt"


@pytest.mark.parametrize(("make", "words"), [
    (_truncated, ["truncated or damaged"]),
    (lambda p: (p / "notes.txt").write_text("hello") and p / "notes.txt",
     ["not a torch checkpoint"]),
    (lambda p: p / "nowhere.pt", ["no such file"]),
    (lambda p: (p / ".metadata").write_bytes(b"") or p, ["DCP"]),
    (lambda p: p, ["unknown layout", "holds nothing"]),
    (lambda p: (p / "notes.txt").write_text("hello") and p, ["unknown layout", "notes.txt"]),
], ids=["truncated", "not torch", "missing path", "DCP folder", "empty folder",
        "unknown folder"])
def test_what_cannot_be_read_is_one_line_and_exit_2(make: Any, words: list[str],
                                                    tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    status, report, err = audit(make(tmp_path), capsys)
    assert status == EXIT_USAGE and report == {}
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]


# ---------------------------------------------------------------- the readers


def test_tensor_scalars_are_read_as_the_numbers_they_hold() -> None:
    """A scale of 0.5 and a step saved as tensors (as a trainer's own dict may hold them)."""
    a = recognize({"scaler": {"scale": torch.tensor(0.5), "growth_factor": 2.0,
                              "_growth_tracker": torch.tensor(3)}, "step": torch.tensor(4)})
    assert a.row("scaler").detail == "scale 0.5, growth tracker 3"
    assert a.row("global step").detail == "step = 4"


def test_safetensors_header_lists_names_dtypes_shapes(tmp_path: Path) -> None:
    tensors = {"w": torch.zeros(3, 4), "b": torch.ones(2)}
    write_safetensors(tmp_path / "m.safetensors", tensors)
    header = safetensors_header(tmp_path / "m.safetensors")
    assert {k: (v.dtype, v.shape) for k, v in header.items()} == {
        k: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for k, t in tensors.items()}


def test_pickle_names_reads_globals_without_running_them(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    globals_, names = pickle_names(pickle.dumps({"random_state": Boom()}))
    assert not marker.exists()
    assert "pathlib.Path.touch" in globals_ and "random_state" in names


# ---------------------------------------------------------------- the measured consequences


def _same_torch() -> None:
    if CACHED["torch"] != torch.__version__:
        pytest.skip(f"measured with torch {CACHED['torch']}, this is {torch.__version__}")


def test_a_cached_consequence_is_what_a_fresh_run_measures() -> None:
    """The control resumes exactly; resetting the epoch (a mutation of the loaded state)
    and its data order are what docs/data/audit_consequences.json says, bit for bit."""
    _same_torch()
    expected = consequences.straight()
    for entry in ("none", "epoch"):
        assert consequences.measure(entry, expected) == CACHED["entries"][entry], entry
    assert CACHED["entries"]["none"] == {"max_dparam": 0.0, "data_order": "same"}


@pytest.mark.slow
def test_every_cached_consequence_is_what_a_fresh_run_measures() -> None:
    _same_torch()
    expected = consequences.straight()
    assert {e: consequences.measure(e, expected) for e in consequences.VARIANTS} == \
        CACHED["entries"]


@pytest.mark.parametrize(("config", "rng", "status", "gaps"), [
    ({"dtype": "float16", "device": "cpu"}, True, EXIT_UNKNOWN, set()),
    ({"dtype": "float16", "device": "cuda"}, True, EXIT_FAILED, {"scaler"}),
    ({"dtype": "bfloat16", "device": "cuda"}, True, EXIT_UNKNOWN, set()),
    ({"dtype": "float16", "device": "cpu"}, False, EXIT_FAILED,
     {"torch CPU RNG", "data position", "epoch"}),
])
def test_a_nanogpt_checkpoint_is_read_as_its_train_py_runs(
        config: dict, rng: bool, status: int, gaps: set, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """nanoGPT's lr is get_lr(iter_num): no scheduler to save; its GradScaler disables itself
    on CPU; its batches are torch.randint draws, so with the CPU RNG saved nothing is missing,
    but the file cannot show the loader: unknown, never exact."""
    state = {**nanogpt(trained()), "config": config}
    if rng:
        state["rng_state"] = torch.get_rng_state()
    torch.save(state, tmp_path / "ckpt.pt")
    got, report, _ = audit(tmp_path / "ckpt.pt", capsys)
    r = rows(report)
    assert report["exact"] is False and got == status
    assert {i for i, row in r.items() if row["need"] == "required" and row["status"]
            not in (PRESENT, "disabled", "not needed")} == gaps
    assert r["scheduler"]["status"] == "not needed"
