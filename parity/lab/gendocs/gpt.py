"""docs/gpt.md: the tape of one block, the bytes held, the claims, the learning control and
the benchmark (from docs/data/gpt_learning.json and docs/data/gpt_bench.json)."""

from __future__ import annotations

import json
from pathlib import Path

from parity.lab.gendocs import section
from parity.lab.gendocs.gpt_tape import TAPE_BATCH, held_totals, tape_rows
from parity.lab.gendocs.recompute import claims_table

DATA = Path(__file__).resolve().parents[3] / "docs" / "data"


def _load(name: str) -> dict | None:
    path = DATA / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


@section("gpt.md", "gpt-tape")
def _() -> str:
    lines = ["| module | saved (torch's node.attr) | shape | dtype | bytes | storage |",
             "|---|---|---|---|---:|---|"]
    for r in tape_rows():
        lines.append(f"| `{r['module']}` | `{r['name']}` | {tuple(r['shape'])} | {r['dtype']} | "
                     f"{r['nbytes']:,} | {'a view: counted already' if r['shared'] else 'own'} |")
    totals = ["| dtype | dropout | tape entries | bytes held (distinct storages) |",
              "|---|---:|---:|---:|"]
    totals += [f"| {d} | {p} | {n} | {b:,} |" for d, p, n, b in held_totals()]
    return (f"The default config, batch {TAPE_BATCH} x 16 tokens, float32, dropout 0.1: the "
            "ends of the model and block 0 (block 1 keeps the same). Rendered from the "
            "reference's tape; `gpt.saved_tensors` holds it equal to torch's hooks.\n\n"
            + "\n".join(lines) + "\n\nThe whole model:\n\n" + "\n".join(totals))


@section("gpt.md", "gpt-claims")
def _() -> str:
    return claims_table("gpt")


@section("gpt.md", "gpt-learning")
def _() -> str:
    data = _load("gpt_learning.json")
    if data is None:
        return "No measurement committed (docs/data/gpt_learning.json is missing)."
    lines = ["| tree | steps to >= {:.0%} copy accuracy | accuracy at step {} | final loss | "
             "seconds for {} steps |".format(data["target_accuracy"], data["control_steps"],
                                             data["curves"][0]["steps"][-1]),
             "|---|---:|---:|---:|---:|"]
    for c in data["curves"]:
        at = dict(zip(c["steps"], c["accuracy"], strict=True)).get(data["control_steps"])
        lines.append(f"| {c['tree']} | {c['steps_to_target']} | {at:.3f} | {c['loss'][-1]:.3f} "
                     f"| {c['seconds']:.1f} |")
    return (f"Measured by `python benchmarks/gpt.py --learn --write` ({data['method']}; batch "
            f"{data['batch']}, AdamW lr {data['lr']}, torch {data['torch']}). The stated "
            f"control, asserted by the slow test `test_the_tiny_gpt_learns_the_copy_task_in_"
            f"both_trees`: >= {data['target_accuracy']:.0%} held-out copy accuracy within "
            f"{data['control_steps']} steps, in both trees.\n\n" + "\n".join(lines))


@section("gpt.md", "gpt-bench")
def _() -> str:
    data = _load("gpt_bench.json")
    if data is None:
        return "No measurement committed (docs/data/gpt_bench.json is missing)."
    lines = ["| threads | config | reference / torch: median [min, max] | reference ms | "
             "torch ms | forward / backward / optimizer: reference / torch (median) |",
             "|---:|---|---:|---:|---:|---:|"]
    for threads, per in data["threads"].items():
        for name, r in per["configs"].items():
            q = r["ratio"]
            phases = " / ".join(f"{v['ratio']['median']:.2f}"
                                for v in r.get("phases", {}).values()) or "-"
            lines.append(f"| {threads} | {name} | {q['median']:.2f} [{q['min']:.2f}, "
                         f"{q['max']:.2f}] | {r['reference_ms']['median']:.1f} | "
                         f"{r['torch_ms']['median']:.1f} | {phases} |")
    prof = ", ".join(f"`{name}` {share:.0%}"
                     for name, share in data["threads"]["1"]["profile_4x"])
    held = ", ".join(f"{k}: tape {v['tape']:,} = hooks {v['hooks']:,}"
                     for k, v in data["held_bytes"].items())
    sd = data["sdpa"]
    sdpa_rows = ["| path | bytes held | block 0 core keeps | FLOPs counted |", "|---|---:|---|---|"]
    for path, r in sd.items():
        keeps = ", ".join(f"`{n}` {tuple(s)}" for n, s, _ in r["core_saved"])
        flops = ", ".join(f"{k} {v:,}" for k, v in r["flops"].items())
        sdpa_rows.append(f"| {path} | {r['held_bytes']:,} | {keeps} | {flops} |")
    return (f"{data['method']}; {data['repeats']} rounds, {data['machine']}, torch "
            f"{data['torch']}, NumPy {data['numpy']}.\n\n" + "\n".join(lines)
            + f"\n\nWhere the reference's step goes (one thread, 4x config, cProfile tottime, "
            "share of the step): "
            f"{prof}.\n\nBytes held after forward (batch {data['batch']}): {held}.\n\n"
            "attention='sdpa' against the explicit path (tiny config, batch 4, float32):\n\n"
            + "\n".join(sdpa_rows))


@section("gpt.md", "gpt-autocast-tape")
def _() -> str:
    from parity.drivers.gpt_amp import autocast_totals

    lines = ["| autocast | lists | dropout | tape entries | bytes held |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {fmt if fmt != 'float32' else 'off (float32)'} | {kind} | {p} | {n} | {b:,} |"
              for fmt, kind, p, n, b in autocast_totals()]
    return (f"The default config, batch {TAPE_BATCH} x 16 tokens, the reference's tape (the "
            "cpu rows are held equal to torch's hooks by `gpt.autocast_saved_tensors`; the "
            "cuda rows are the reference's emulation of the CUDA lists, where softmax is "
            "fp32, with the CPU's dropout noise, not CUDA's bool mask).\n\n"
            + "\n".join(lines))


@section("gpt.md", "gpt-loss-scaling")
def _() -> str:
    from parity.drivers.loss_scaling_gpt import gpt_trajectory

    t = gpt_trajectory()
    # Torch's losses are not printed: their last float32 digits follow torch's kernels and
    # change between torch versions, and a generated page must not depend on the version
    # installed. The scales and skips are the claim; the reference's losses are NumPy's,
    # and even those move in the 5th digit with the GEMM kernel OpenBLAS picks for the CPU
    # (its summation order: two machines gave 2.49814 and 2.49815 at step 11), so 3 decimals.
    rows = ["| step | scale after (both trees) | skipped | loss (reference) |",
            "|---:|---:|---|---:|"]
    rows += [f"| {i} | {s:g} | {'yes' if k else ''} | {lr:.3f} |"
             for i, (s, k, lr) in enumerate(zip(t.ref_scales, t.ref_skipped, t.ref_losses,
                                                strict=True))]
    return "\n".join(rows) + ("\n\nTorch's losses agree to float32 rounding; their last "
                              "digits vary with the torch version, so they are not printed. "
                              "The reference's are rounded to 3 decimals: their 5th digit "
                              "follows the GEMM kernel OpenBLAS picks for the CPU.")


@section("gpt.md", "gpt-autocast-free")
def _() -> str:
    data = _load("gpt_autocast_free.json")
    if data is None:
        return "No measurement committed (docs/data/gpt_autocast_free.json is missing)."
    lines = ["| autocast | difference born at | loss: reference - torch (float32 ulps) | "
             "logits differing (max lp ulps) | parameter gradients differing: tensors, "
             "elements | worst gradient max abs diff / max abs |", "|---|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['fmt']} | `{r['first']}` | {r['loss_ulps']:+d} | "
                     f"{r['logits_differ']} of {r['logits']} ({r['logits_max_ulps']}) | "
                     f"{r['grad_tensors_differ']} of {r['grad_tensors']}, "
                     f"{r['grad_elements_differ']:,} of {r['grad_elements']:,} | "
                     f"{r['grad_worst_rel']:.1e} |")
    return (f"Measured by `python benchmarks/gpt.py --free --write` (torch {data['torch']}; the "
            "figures depend on torch's kernels): the default config, dropout 0, batch "
            f"{data['batch']} x 16 tokens, torch on one thread, each tree running itself "
            "(claims `gpt.autocast_free`, `gpt.autocast_free_residual`; NOTE [ Where a "
            "free-running autocast run diverges ] in parity/drivers/gpt_free.py):\n\n"
            + "\n".join(lines))
