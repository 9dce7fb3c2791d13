"""One optimization through the gauntlet against the eager float32 baseline: equivalence
(its claims), timing with spread and a bootstrap interval, learning controls, resume.

    python -m parity optimize --what {autocast-bf16,autocast-fp16,recompute:SPEC,compile,
        loader-workers:N} [--model mlp|gpt] [--repeats R] [--steps K] [--out DIR]

--model gpt (the compact transformer of `train --model gpt`, on the copy task) takes
autocast-bf16, recompute:SPEC (SPEC over its blocks, selective, SPEC+selective) and compile;
any other combination is refused naming what is supported. compile: the model's forward under
torch.compile (Inductor, fullgraph; the transformer's token check an assertion inside
the graph) in a fresh Inductor cache; its first call, the compile, is timed apart from the
steady-state steps.

Writes DIR/optimize-<what>.md (optimize-gpt-<what>.md for the transformer: the report),
.json (every number) and .png (the timing distributions, when matplotlib is installed).
The verdict line is last:
`optimize: <what> PASS|FAIL, speedup X [lo, hi] (null|faster|slower)`.
A null result (the interval contains 1) is reported as null with the mechanism's expectation
beside it, never as a gain. Timing: CPU time of this process per step (wall time for
loader-workers, whose work moves to other processes), torch on one thread, R repeats of K
steps per side interleaved ABBA after a warm-up block. Method and thresholds:
parity/lab/runners/optimize.py and docs/optimize.md.
Exit status: 0 every check passed (whatever the speedup); 1 a check failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from parity.lab.cli import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    int_at_least,
    output_folder,
    pictures_skipped,
)

HELP = "an optimization vs eager fp32: equivalence, timing spread, learning, resume"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", required=True, metavar="WHAT",
                   help="autocast-bf16 | autocast-fp16 | recompute:SPEC | compile | "
                        "loader-workers:N")
    p.add_argument("--model", choices=("mlp", "gpt"), default="mlp",
                   help="the model optimized: the compact MLP (default) or the compact "
                        "transformer (gpt: autocast-bf16, recompute:SPEC, compile)")
    p.add_argument("--repeats", type=int_at_least(3), default=15, metavar="R",
                   help="timed repeats per side (default 15)")
    p.add_argument("--steps", type=int_at_least(1), default=10, metavar="K",
                   help="training steps per timed repeat (default 10)")
    p.add_argument("--out", default="optimize-report", metavar="DIR",
                   help="where the report goes (default optimize-report/)")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from parity.lab.runners import optimize as drv

    try:
        opt = drv.parse(args.what, args.model)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = output_folder(args.out, command=args.command)
    stages = tqdm(total=len(opt.claims) + 4, desc=f"optimize {opt.what}", unit="stage",
                  leave=False)

    def progress(text: str) -> None:
        stages.set_postfix_str(text)
        stages.update(1)

    try:
        g = drv.run_gauntlet(opt, args.repeats, args.steps, progress)
    finally:
        stages.close()
    stem = stem_of(opt)
    (out / f"{stem}.json").write_text(json.dumps(as_json(g), indent=1) + "\n")
    picture = draw(g, out / f"{stem}.png")
    if picture is None:
        pictures_skipped(args)
    (out / f"{stem}.md").write_text(markdown(g, picture))
    print(markdown(g, picture), end="")
    print(f"report: {out / (stem + '.md')}")
    print(f"optimize: {opt.what} {'PASS' if g.passed else 'FAIL'}, speedup {verdict(g)}")
    return EXIT_OK if g.passed else EXIT_FAILED


def stem_of(opt: object) -> str:
    """optimize-<what> (MLP) or optimize-gpt-<what>, ':' and '+' spelled '-'."""
    model = "" if opt.model == "mlp" else f"{opt.model}-"  # type: ignore[attr-defined]
    what = opt.what.replace(":", "-").replace("+", "-")  # type: ignore[attr-defined]
    return f"optimize-{model}{what}"


def verdict(g: object) -> str:
    ratio, low, high = g.speedup  # type: ignore[attr-defined]
    word = "null" if g.null else ("faster" if low > 1 else "slower")  # type: ignore[attr-defined]
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}] ({word})"


def as_json(g: object) -> dict:
    from dataclasses import asdict

    from parity.lab.runners.optimize import BASELINES, CONTROLS

    d = asdict(g)  # type: ignore[call-overload]
    d["passed"], d["null"] = g.passed, g.null  # type: ignore[attr-defined]
    model = g.opt.model  # type: ignore[attr-defined]
    d["baseline_config"] = {k: list(v) if isinstance(v, tuple) else v
                            for k, v in BASELINES[model].items()}
    c = CONTROLS[model]
    d["controls"] = {"learn_steps": c.steps, "loss_band": c.loss_band,
                     "accuracy": c.threshold, "measures": c.measures}
    return d


def _baseline_words(model: str) -> str:
    from parity.lab.runners.optimize import BASELINES

    b = BASELINES[model]
    if model == "gpt":
        return (f"the torch compact transformer of `train --model gpt` (4 blocks, width 32) on "
                f"the copy task, batch {b['batch_size']}, AdamW lr {b['lr']:g}")
    return f"the torch MLP {b['sizes']}, batch {b['batch_size']}"


def markdown(g: object, picture: Path | None) -> str:
    from parity.lab.runners import optimize_timing
    from parity.lab.runners.optimize import CONTROLS, RESUME_AT, RESUME_TOTAL, spread

    opt, t = g.opt, g.timing  # type: ignore[attr-defined]
    base, optimized = t.samples(opt.timer)
    clock = "CPU time of this process" if opt.timer == "cpu" else "wall time"
    title = opt.what if opt.model == "mlp" else f"{opt.what} (--model {opt.model})"
    lines = [f"# optimize: {title}", "",
             f"Baseline: {_baseline_words(opt.model)}, float32, eager, no recomputation, one "
             f"thread. Verdict: **{'PASS' if g.passed else 'FAIL'}**; speedup {verdict(g)}.",
             "", "## Equivalence", "", "| claim | bound | observed | holds |",
             "|---|---|---|---|"]
    lines += [f"| {cid} | {bound} | {observed:.4g} | {'yes' if ok else 'NO'} |"
              for cid, observed, bound, ok in g.claims]  # type: ignore[attr-defined]
    d = g.distance  # type: ignore[attr-defined]
    lines += ["", f"Distance from the float32 step on one batch (informative, the claims above "
              f"bound it): loss {d['loss']:.3g}, gradients {d['gradients']:.3g} "
              "(max |difference| / max |float32 value|)"
              + ("; bit for bit equal." if d.get("bitwise") else "; not bit for bit equal."),
              "", "## Timing", "",
              f"Seconds per step, {clock}, {len(base)} repeats of {t.steps} steps per side, "
              "interleaved ABBA after a warm-up block; speedup = median baseline / median "
              f"optimized, {optimize_timing.CONFIDENCE:.0%} bootstrap interval. Each side's "
              "first call is timed apart on the wall clock and is in no sample.", "",
              "| | median | IQR | first call (wall) |", "|---|---|---|---|"]
    first = t.first_call_wall
    for name, x in (("baseline", base), ("optimized", optimized)):
        m, q25, q75 = spread(x)
        call = f"{first[name]:.3f} s" if name in first else "-"
        lines.append(f"| {name} | {m * 1e3:.3f} ms | {q25 * 1e3:.3f}-{q75 * 1e3:.3f} ms | "
                     f"{call} |")
    if opt.compiled and "optimized" in first:
        m = spread(optimized)[0]
        lines += ["", "Compile time (the optimized side's first call, the gauntlet's first "
                  "compile: fresh Inductor cache, Dynamo reset): "
                  f"{first['optimized']:.2f} s of wall time, paid once per process; at the "
                  "measured steady-state gain it is repaid after "
                  f"{_break_even(first['optimized'], spread(base)[0], m)}."]
    lines += ["", f"Speedup {verdict(g)}. What the mechanism predicts here: "
              f"{opt.expectation}."]
    if picture is not None:
        lines += ["", f"![timing distributions]({picture.name})"]
    c = CONTROLS[opt.model]
    lines += ["", "## Learning controls", "",
              f"{g.learning['baseline'].steps} steps from the same seed; "  # type: ignore
              f"band: mean loss of the last 10 steps <= {c.loss_band} x the first step's "
              f"loss; accuracy ({c.measures}) >= {c.threshold}.", "",
              "| run | first loss | last-10 loss | in band | accuracy | passes |",
              "|---|---|---|---|---|---|"]
    for name, r in g.learning.items():  # type: ignore[attr-defined]
        lines.append(f"| {name} | {r.initial_loss:.4f} | {r.final_loss:.4f} | "
                     f"{'yes' if r.in_band else 'NO'} | {r.accuracy:.4f} | "
                     f"{'yes' if r.accurate else 'NO'} |")
    mismatches, n, same = g.resume  # type: ignore[attr-defined]
    twin = "its uninterrupted twin"
    if opt.compiled:
        twin = ("its uninterrupted twin, compiled as well (a compiled step is "
                + ("bit for bit the eager one here" if d.get("bitwise") else
                   "not bit for bit the eager one: fusion rounds elsewhere, within "
                   f"{g.claims[0][0]}'s bound, so the exact comparison is compiled against "
                   "compiled") + ")")
    lines += ["", "## Resume", "",
              f"The optimized run interrupted at step {RESUME_AT} (checkpoint file written, "
              f"every object dropped, resumed from the file) to step {RESUME_TOTAL}, against "
              f"{twin}: {mismatches:g} mismatching of {n} state values; state digests "
              f"{'equal' if same else 'DIFFER'}.", "",
              f"Gauntlet time: {g.seconds:.1f} s.", ""]  # type: ignore[attr-defined]
    return "\n".join(lines)


def _break_even(compile_s: float, base_step: float, step: float) -> str:
    if step >= base_step:
        return "no number of steps (the compiled step is not faster)"
    return f"{compile_s / (base_step - step):,.0f} steps"


def draw(g: object, path: Path) -> Path | None:
    """The two timing distributions (every repeat a dot, the median a bar), or None without
    matplotlib."""
    from parity.lab.pictures import have_matplotlib

    if not have_matplotlib():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    opt, t = g.opt, g.timing  # type: ignore[attr-defined]
    base, optimized = t.samples(opt.timer)
    fig, ax = plt.subplots(figsize=(5, 3))
    for i, x in enumerate((base, optimized)):
        ax.plot([i] * len(x), x * 1e3, "o", alpha=0.5)
        ax.hlines(float(np.median(x)) * 1e3, i - 0.2, i + 0.2, color="black")
    ax.set_xticks([0, 1], [f"baseline fp32 ({opt.model})", opt.what])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel("ms per step (" + ("CPU" if opt.timer == "cpu" else "wall") + ")")
    ax.set_title(f"speedup {verdict(g)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
